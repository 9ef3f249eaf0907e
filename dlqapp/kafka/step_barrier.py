"""The barrier between a partition's stream steps and its commits."""

from __future__ import annotations

import asyncio


class StepBarrier:
    """Steps share a partition's open transaction; a commit waits for the steps inside and
    holds new ones back until the next transaction has begun."""

    def __init__(self) -> None:
        self._inside = 0
        self._committing = False
        self._changed = asyncio.Condition()

    @property
    def inside(self) -> int:
        return self._inside

    async def enter(self) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._committing)
            self._inside += 1

    async def leave(self) -> None:
        async with self._changed:
            self._inside -= 1
            self._changed.notify_all()

    async def close(self) -> None:
        """Hold new steps back and wait until none is inside (the caller commits, then `reopen`s)."""
        async with self._changed:
            self._committing = True
            await self._changed.wait_for(lambda: self._inside == 0)

    async def reopen(self) -> None:
        async with self._changed:
            self._committing = False
            self._changed.notify_all()
