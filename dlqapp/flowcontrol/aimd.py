"""The adaptive concurrency limit: additive increase, multiplicative decrease (pure).

Modelled on Netflix's concurrency-limits `AIMDLimit`, with TCP's pacing:

- a *drop* is a call the backend refused (`rate_limited`) or could not serve in time (a
  `timeout` that took its time: `pushed_back`) or a *slow* success: slower than
  `slow_factor` × the running average latency and at least `slow_margin_s` slower than it;
- on a drop the limit is multiplied by `backoff_ratio`, at most once per `cooldown`
  (one average latency, so the calls already in flight when the backend pushed back do
  not cut it again and again);
- on a success while at least half the limit is in use, the limit grows: by 1 (it
  doubles every round trip) in *slow start*, from the floor until the first drop and
  after a drop back up to half the limit the drop cut, then by 1/limit (about +1 per
  round trip), up to the ceiling (`DLQ_CONCURRENCY`);
- it never goes below the floor (`DLQ_CONCURRENCY_FLOOR`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dlqapp.core.errors import ErrorClass, Failure

AVERAGE_WEIGHT = 0.05
"""Weight of a new sample in the running average latency."""


class AimdLimit:
    """The concurrency limit, moved by every call's outcome."""

    def __init__(
        self,
        floor: int,
        ceiling: int,
        clock: Callable[[], float],
        *,
        backoff_ratio: float = 0.7,
        slow_factor: float = 3.0,
        slow_margin_s: float = 0.25,
        min_cooldown_s: float = 0.05,
    ) -> None:
        if not 1 <= floor <= ceiling:
            raise ValueError(f"need 1 <= floor ({floor}) <= ceiling ({ceiling})")
        self.floor = floor
        self.ceiling = ceiling
        self.backoff_ratio = backoff_ratio
        self.slow_factor = slow_factor
        self.slow_margin_s = slow_margin_s
        self.min_cooldown_s = min_cooldown_s
        self._clock = clock
        self._limit = float(floor)
        self._threshold = float(ceiling)
        self._average_s: float | None = None
        self._last_decrease = -math.inf
        self.decreases = 0

    @property
    def limit(self) -> int:
        """Calls that may be in flight now."""
        return max(self.floor, int(self._limit))

    @property
    def average_latency_s(self) -> float | None:
        return self._average_s

    def is_slow(self, latency_s: float) -> bool:
        """A success slow enough to count as the backend pushing back."""
        average = self._average_s
        return (
            average is not None and latency_s > self.slow_factor * average and latency_s - average >= self.slow_margin_s
        )

    def on_sample(self, latency_s: float, dropped: bool, in_flight: int) -> int:
        """Record one call (`dropped`: refused or timed out); returns the new limit."""
        if not dropped and self.is_slow(latency_s):
            dropped = True
        if not dropped:
            self._average_s = (
                latency_s
                if self._average_s is None
                else self._average_s + AVERAGE_WEIGHT * (latency_s - self._average_s)
            )
            if in_flight * 2 >= self._limit:
                step = 1.0 if self._limit < self._threshold else 1 / max(self._limit, 1.0)
                self._limit = min(float(self.ceiling), self._limit + step)
            return self.limit
        now = self._clock()
        if now - self._last_decrease >= self._cooldown_s():
            self._threshold = max(float(self.floor), self._limit / 2)
            self._limit = max(float(self.floor), self._limit * self.backoff_ratio)
            self._last_decrease = now
            self.decreases += 1
        return self.limit

    def _cooldown_s(self) -> float:
        return max(self.min_cooldown_s, self._average_s or 0.0)


def pushed_back(failure: Failure | None, latency_s: float, timeout_s: float, slow: Callable[[float], bool]) -> bool:
    """Whether a failed call is the backend pushing back (a drop): a refusal (`rate_limited`),
    or a `timeout` that took its time, at least half of `timeout_s` (DLQ_INFERENCE_TIMEOUT)
    or `slow` next to the calls around it (`AimdLimit.is_slow`). A timeout reported at once
    (the simulated backend's) says nothing about load: counted, it held the README demo's
    limit at its floor, and retries queued behind one call at a time."""
    if failure is None:
        return False
    if failure.error_class is ErrorClass.RATE_LIMITED:
        return True
    return failure.error_class is ErrorClass.TIMEOUT and (latency_s >= timeout_s / 2 or slow(latency_s))
