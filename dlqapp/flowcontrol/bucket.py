"""A token bucket on an injected clock (pure).

It refills at `rate_per_s` up to `capacity`. `take` may drive it below zero (a request
larger than the bucket, or a correction once the real usage is known): that debt is
repaid by the refill before anything else may go.
"""

from __future__ import annotations

import math
from collections.abc import Callable


class TokenBucket:
    """Capacity that refills continuously; callers ask how long until they may take."""

    def __init__(self, rate_per_s: float, capacity: float, clock: Callable[[], float], *, initial: float = 0.0) -> None:
        self.rate_per_s = rate_per_s
        self.capacity = capacity
        self._clock = clock
        self._level = min(initial, capacity)
        self._at = clock()

    @property
    def level(self) -> float:
        """Tokens available now (negative while in debt)."""
        self._refill()
        return self._level

    def _refill(self) -> None:
        now = self._clock()
        if now > self._at:
            self._level = min(self.capacity, self._level + (now - self._at) * self.rate_per_s)
        self._at = max(self._at, now)

    def wait_s(self, amount: float) -> float:
        """Seconds until `amount` may be taken (0: now). More than the capacity waits for a full bucket."""
        need = min(amount, self.capacity) - self.level
        if need <= 0:
            return 0.0
        if self.rate_per_s <= 0:
            return math.inf
        return need / self.rate_per_s

    def take(self, amount: float) -> None:
        """Take `amount` (call when `wait_s(amount)` is 0; may leave the bucket in debt)."""
        self._refill()
        self._level -= amount

    def give_back(self, amount: float) -> None:
        """Return unused tokens (never above capacity); a negative amount adds debt."""
        self._refill()
        self._level = min(self.capacity, self._level + amount)

    def set_rate(self, rate_per_s: float, capacity: float) -> None:
        """A new rate (this worker's share changed): the level never exceeds the new capacity."""
        self._refill()
        self.rate_per_s = rate_per_s
        self.capacity = capacity
        self._level = min(self._level, capacity)
