"""Dead-letter alerts: a structured log line each (dlqapp.deadletters.recorder), and an optional webhook.

The webhook receives one Slack-compatible message per `DLQ_ALERT_WINDOW` with counts by
error class. Posting happens in a background task and is retried with backoff; a
failed window's counts are carried into the next one. Nothing here blocks the pipeline.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import aiohttp

from dlqapp.observability.logs import log_event

log = logging.getLogger("dlqapp.deadletters.alerts")

SAMPLE_IDS = 5
POST_ATTEMPTS = 4
POST_TIMEOUT_S = 10.0


def slack_message(counts: Counter[str], sample: list[str], *, window_s: float, app_id: str) -> dict[str, Any]:
    """A Slack-compatible body: `text` for people, `dlqapp` for machines."""
    total = sum(counts.values())
    by_class = ", ".join(f"{cls} {n}" for cls, n in counts.most_common())
    examples = f" (e.g. {', '.join(sample)})" if sample else ""
    text = (
        f":rotating_light: {app_id}: {total} dead letter{'s' if total != 1 else ''} in the last {window_s:g}s: "
        f"{by_class}{examples}"
    )
    return {
        "text": text,
        "dlqapp": {"app_id": app_id, "total": total, "by_error_class": dict(counts), "sample": sample},
    }


class AlertBatcher:
    """Collects dead letters and posts a summary per window to the webhook."""

    def __init__(self, url: str, window_ms: int, app_id: str) -> None:
        self.url = url
        self.window_s = window_ms / 1000
        self.app_id = app_id
        self.counts: Counter[str] = Counter()
        self.sample: list[str] = []
        self.sent = 0

    def add(self, request_id: str, error_class: str) -> None:
        """Count one dead letter (never blocks)."""
        self.counts[error_class] += 1
        if len(self.sample) < SAMPLE_IDS:
            self.sample.append(request_id)

    async def run(self, should_stop: Any) -> None:
        """Flush every window until `should_stop()`."""
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=POST_TIMEOUT_S)) as session:
            while not should_stop():
                await asyncio.sleep(self.window_s)
                await self.flush(session)

    async def flush(self, session: aiohttp.ClientSession) -> None:
        if not self.counts:
            return
        counts, sample = self.counts, self.sample
        self.counts, self.sample = Counter(), []
        body = slack_message(counts, sample, window_s=self.window_s, app_id=self.app_id)
        if await self._post(session, body):
            self.sent += 1
            return
        self.counts.update(counts)  # try again next window, with whatever arrives meanwhile
        self.sample = (sample + self.sample)[:SAMPLE_IDS]

    async def _post(self, session: aiohttp.ClientSession, body: dict[str, Any]) -> bool:
        for attempt in range(1, POST_ATTEMPTS + 1):
            try:
                async with session.post(self.url, json=body) as response:
                    if response.status < 300:
                        return True
                    problem = f"HTTP {response.status}"
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            log_event(log, logging.WARNING, "alert_webhook_failed", attempt=attempt, problem=problem)
            if attempt < POST_ATTEMPTS:
                await asyncio.sleep(min(0.5 * 2 ** (attempt - 1), self.window_s))
        return False
