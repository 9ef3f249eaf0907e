"""A clock for flow control's tests: seconds that move only when told to."""

from __future__ import annotations

import asyncio


class Clock:
    """Seconds that move only when told to (or when a fake sleep passes them)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)
