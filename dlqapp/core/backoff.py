"""How long each retry tier waits (pure)."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Delay before each retry tier.

    `tiers`: tier k waits `delays_ms[k]`. `exponential`: tier k waits
    `delays_ms[0] * 2**k`, with the top `jitter` fraction randomised.
    A provider's retry-after is honoured exactly: the delay is never shorter.
    """

    delays_ms: tuple[int, ...]
    mode: str = "tiers"
    jitter: float = 0.2

    def delay_ms(self, tier: int, retry_after_ms: int | None = None, rng: random.Random | None = None) -> int:
        """Delay before the attempt made from tier `tier` (0-based)."""
        if self.mode == "exponential":
            base = self.delays_ms[0] * (2**tier)
            spread = base * self.jitter
            delay = int(base - spread + (rng or random).random() * spread)
        else:
            delay = self.delays_ms[tier]
        return max(delay, retry_after_ms or 0)
