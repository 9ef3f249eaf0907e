"""The one fake clock of the unit tests: a time that moves only when told to."""

from __future__ import annotations

import asyncio


class FakeClock:
    """`clock()` is `now`, in whatever unit the code under test counts (epoch ms for the
    pipeline, monotonic seconds for flow control); `sleep(seconds)` moves it on."""

    def __init__(self, now: float = 1_700_000_000_000, per_second: float = 1000) -> None:
        self.now = now
        self.per_second = per_second

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds * self.per_second
        await asyncio.sleep(0)


def seconds_clock() -> FakeClock:
    """A clock of monotonic seconds (flow control's)."""
    return FakeClock(now=1000.0, per_second=1)
