"""Time, injectable: production uses the wall clock, tests a fixed one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

Clock = Callable[[], int]
"""Returns the time in epoch milliseconds."""


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds."""
    return time.time_ns() // 1_000_000


async def sleep_until(clock: Clock, at_ms: int) -> None:
    """Until `clock` reads `at_ms` or later (asleep, rechecking the clock after each sleep)."""
    while (early_ms := at_ms - clock()) > 0:
        await asyncio.sleep(early_ms / 1000)
