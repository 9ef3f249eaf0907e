"""The barrier between a partition's stream steps and its commits."""

from __future__ import annotations

import asyncio


class StepBarrier:
    """Steps share a partition's open transaction; a commit waits for the steps inside and
    holds new ones back until the next transaction has begun.

    Every step enters and leaves once, so both are plain counter moves unless a commit is
    under way (no lock: one event loop, and no await between a check and its move). One
    commit at a time closes it (the transaction's commit lock)."""

    def __init__(self) -> None:
        self._inside = 0
        self._committing = False
        self._open = asyncio.Event()
        self._open.set()
        self._empty = asyncio.Event()
        self._empty.set()

    @property
    def inside(self) -> int:
        return self._inside

    async def enter(self) -> None:
        while self._committing:
            await self._open.wait()
        self._inside += 1

    async def leave(self) -> None:
        self._inside -= 1
        if not self._inside:
            self._empty.set()

    async def close(self) -> None:
        """Hold new steps back and wait until none is inside (the caller commits, then `reopen`s)."""
        self._committing = True
        self._open.clear()
        try:
            while self._inside:
                self._empty.clear()
                await self._empty.wait()
        except BaseException:  # no commit follows: let the steps in again
            await self.reopen()
            raise

    async def reopen(self) -> None:
        self._committing = False
        self._open.set()
