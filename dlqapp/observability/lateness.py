"""Retry lateness as it was: attempt start minus due time, kept per tier for a while.

The Prometheus histogram (`dlqapp_retry_lateness_seconds`) is for dashboards; its buckets
are too coarse for the console (a p99 of 12 ms and one of 90 ms both read `0.1`). This
keeps the recent samples themselves, so `/health/` and the console show exact quantiles.
"""

from __future__ import annotations

import math
from collections import deque

WINDOW_MS = 300_000
"""Samples older than this (5 minutes) no longer count."""
MAX_SAMPLES = 20_000
"""Most samples kept per tier (the newest): bounds the memory at a few hundred KiB."""


def quantile(sorted_values: list[int], q: float) -> int:
    """The nearest-rank quantile of a sorted, non-empty list."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


class LatenessWindow:
    """The last WINDOW_MS of retry lateness samples, per tier label."""

    def __init__(self, window_ms: int = WINDOW_MS, max_samples: int = MAX_SAMPLES) -> None:
        self.window_ms = window_ms
        self.max_samples = max_samples
        self._samples: dict[str, deque[tuple[int, int]]] = {}

    def add(self, tier: str, late_ms: int, at_ms: int) -> None:
        """A retry of `tier` started `late_ms` after its due time, at `at_ms`."""
        samples = self._samples.get(tier)
        if samples is None:
            samples = self._samples[tier] = deque(maxlen=self.max_samples)
        samples.append((at_ms, max(0, late_ms)))

    def _recent(self, now_ms: int, window_ms: int | None) -> dict[str, list[int]]:
        oldest = now_ms - self.window_ms
        since = now_ms - min(window_ms or self.window_ms, self.window_ms)
        recent = {}
        for tier, samples in self._samples.items():
            while samples and samples[0][0] < oldest:
                samples.popleft()
            values = sorted(late for at, late in samples if at >= since)
            if values:
                recent[tier] = values
        return recent

    def summary(self, now_ms: int, window_ms: int | None = None) -> dict[str, dict[str, int]]:
        """Per tier: count, p50, p99 and max lateness in ms over the last `window_ms`
        (at most, and by default, the whole window kept)."""
        return {
            tier: {
                "count": len(values),
                "p50_ms": quantile(values, 0.5),
                "p99_ms": quantile(values, 0.99),
                "max_ms": values[-1],
            }
            for tier, values in sorted(self._recent(now_ms, window_ms).items())
        }

    def p99_ms(self, now_ms: int, window_ms: int | None = None) -> int | None:
        """The p99 over every tier together (None with no retry in the window)."""
        values = sorted(v for tier_values in self._recent(now_ms, window_ms).values() for v in tier_values)
        return quantile(values, 0.99) if values else None
