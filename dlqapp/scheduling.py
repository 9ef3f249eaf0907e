"""When a retry is due, and how parked retries are keyed so byte order is time order.

Pure code. A parked retry's key is `big-endian u64 due_ms ‖ request_id (UTF-8)`, so a
RocksDB scan from the first key up to `due_upper_bound(now)` yields exactly the due ones,
earliest first.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

_DUE = struct.Struct(">Q")


def parked_key(due_ms: int, request_id: str) -> bytes:
    """Table key of a parked retry."""
    return _DUE.pack(due_ms) + request_id.encode()


def decode_parked_key(key: bytes) -> tuple[int, str]:
    """(due_ms, request_id) of a parked-retry key."""
    return _DUE.unpack_from(key)[0], key[_DUE.size :].decode("utf-8", "replace")


def due_upper_bound(now_ms: int) -> bytes:
    """Exclusive upper bound that admits every key due at or before `now_ms`."""
    return _DUE.pack(now_ms + 1)


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
