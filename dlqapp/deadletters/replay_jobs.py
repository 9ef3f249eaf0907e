"""Bulk replays: all at once (bounded concurrency), answered when done, or as a background
job (rate-limited, or as fast as all at once) whose progress can be asked for."""

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
    """A bulk replay running on this worker in the background."""

    id: str
    keys: list[str]
    rate: float | None
    """Replays per second at most; None: BULK_CONCURRENCY at a time, as fast as they go."""
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
        await _all_at_once(keys, replay, report)
        return report

    def start(self, keys: list[str], rate: float | None, replay: ReplayOne) -> ReplayJob:
        """Replay `keys` in the background, at most `rate` per second (None: as `run_now` does)."""
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
        if job.rate is None:
            await _all_at_once(job.keys, replay, job.report)
            job.finished_at = time.time()
            return
        interval = 1.0 / job.rate
        next_at = time.monotonic()
        for key in job.keys:
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            next_at += interval
            _note(job.report, key, await replay(key))
        job.finished_at = time.time()


async def _all_at_once(keys: list[str], replay: ReplayOne, report: dict[str, list[str]]) -> None:
    """Replay every key, BULK_CONCURRENCY at a time, noting each outcome in `report`."""
    slots = asyncio.Semaphore(BULK_CONCURRENCY)

    async def one(key: str) -> None:
        async with slots:
            result = await replay(key)
        _note(report, key, result)

    await asyncio.gather(*(one(k) for k in keys))


def _note(report: dict[str, list[str]], key: str, result: dict[str, Any]) -> None:
    """`key`'s replay under its outcome (`error` when the answer names none known)."""
    status = result.get("status")
    report[status if status in report else "error"].append(key)
