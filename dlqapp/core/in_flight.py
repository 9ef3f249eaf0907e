"""Which requests have an attempt running in this worker right now."""

from __future__ import annotations

import asyncio


class InFlight:
    """Request ids with an attempt running here, and a way to wait until one has none.

    Live only in memory: a crash must not leave a request marked in flight.
    """

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._idle_waiters: dict[str, asyncio.Event] = {}

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, request_id: str) -> None:
        self._ids.add(request_id)

    def discard(self, request_id: str) -> None:
        """The attempt ended: wake whoever waits for the request to be idle."""
        self._ids.discard(request_id)
        waiter = self._idle_waiters.pop(request_id, None)
        if waiter is not None:
            waiter.set()

    async def wait_until_idle(self, request_id: str, timeout_s: float) -> bool:
        """Wait until no attempt of the request runs here (its previous attempt may still be
        finishing its step when its retry is handed over early); False after `timeout_s`."""
        if request_id not in self._ids:
            return True
        waiter = self._idle_waiters.setdefault(request_id, asyncio.Event())
        try:
            await asyncio.wait_for(waiter.wait(), timeout_s)
        except TimeoutError:
            return False
        return request_id not in self._ids
