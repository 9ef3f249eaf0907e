"""Bulk replays: all at once (bounded concurrency) or as a rate-limited background job."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from dlqapp.core.commands import BULK_OUTCOMES

ReplayOne = Callable[[str], Awaitable[dict[str, Any]]]
BULK_CONCURRENCY = 16
KEEP_FINISHED_S = 3600.0
"""A finished rate-limited replay's progress is kept this long, then forgotten."""


def _empty_report() -> dict[str, list[str]]:
    return {status.value: [] for status in BULK_OUTCOMES}


@dataclass
class ReplayJob:
    """A rate-limited bulk replay running on this worker."""

    id: str
    keys: list[str]
    rate: float
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    report: dict[str, list[str]] = field(default_factory=_empty_report)

    def progress(self) -> dict[str, Any]:
        done = sum(len(v) for v in self.report.values())
        return {
            "replay_id": self.id,
            "state": "done" if self.finished_at else "running",
            "total": len(self.keys),
            "done": done,
            "rate": self.rate,
            "started_at": int(self.started_at * 1000),
            "finished_at": int(self.finished_at * 1000) if self.finished_at else None,
            **self.report,
        }


class ReplayJobs:
    """Runs bulk replays and remembers the rate-limited ones for progress queries."""

    def __init__(self) -> None:
        self._jobs: dict[str, ReplayJob] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def get(self, job_id: str) -> ReplayJob | None:
        return self._jobs.get(job_id)

    async def run_now(self, keys: list[str], replay: ReplayOne) -> dict[str, list[str]]:
        """Replay every key, a few at a time; report ids per outcome."""
        report = _empty_report()
        slots = asyncio.Semaphore(BULK_CONCURRENCY)

        async def one(key: str) -> None:
            async with slots:
                result = await replay(key)
            report[result.get("status", "error") if result.get("status") in report else "error"].append(key)

        await asyncio.gather(*(one(k) for k in keys))
        return report

    def start(self, keys: list[str], rate: float, replay: ReplayOne) -> ReplayJob:
        """Replay `keys` at most `rate` per second in the background."""
        self._prune(time.time())
        job = ReplayJob(id=uuid.uuid4().hex[:12], keys=keys, rate=rate)
        self._jobs[job.id] = job
        task = asyncio.create_task(self._run(job, replay))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    def _prune(self, now: float) -> None:
        for job_id, job in list(self._jobs.items()):
            if job.finished_at is not None and now - job.finished_at > KEEP_FINISHED_S:
                del self._jobs[job_id]

    @staticmethod
    async def _run(job: ReplayJob, replay: ReplayOne) -> None:
        interval = 1.0 / job.rate
        next_at = time.monotonic()
        for key in job.keys:
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            next_at += interval
            result = await replay(key)
            status = result.get("status")
            job.report[status if status in job.report else "error"].append(key)
        job.finished_at = time.time()
