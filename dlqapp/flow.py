"""Concurrency without losing at-least-once: an in-flight window and a priority limiter.

`InFlightWindow` runs one handler task per event, many at once, but acks events of a
partition strictly in offset order: an event is acked only once it and every earlier
event of its partition are done. Faust therefore never sees an out-of-order ack, and
its offset-commit bug with out-of-order acks (faust #606) cannot commit past a message
whose outcome is not yet confirmed.

`PriorityLimiter` bounds backend calls and serves due retries before fresh input.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Hashable, Protocol

log = logging.getLogger(__name__)


class Ackable(Protocol):
    def ack(self) -> bool: ...


class InFlightWindow:
    """At most `limit` handlers in flight; acks per partition in arrival order."""

    def __init__(self, limit: int, on_fatal: Callable[[BaseException], None]) -> None:
        self._slots = asyncio.Semaphore(limit)
        self._pending: dict[Hashable, deque[list[Any]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._on_fatal = on_fatal

    async def submit(self, partition: Hashable, event: Ackable, handler: Callable[[], Awaitable[None]]) -> None:
        """Start `handler()` for `event`; waits while the window is full.

        The task inherits the caller's context, so Faust's `current_event()` (and with
        it table writes) refers to `event` inside the handler.
        """
        await self._slots.acquire()
        entry = [event, False]
        self._pending.setdefault(partition, deque()).append(entry)
        task = asyncio.create_task(self._run(partition, entry, handler))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, partition: Hashable, entry: list[Any], handler: Callable[[], Awaitable[None]]) -> None:
        try:
            await handler()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a handler bug: never ack, crash so the event is redelivered
            log.exception("handler failed; the event stays unacked and the worker stops")
            self._on_fatal(exc)
            return
        finally:
            self._slots.release()
        entry[1] = True
        self._ack_ready(partition)

    def _ack_ready(self, partition: Hashable) -> None:
        queue = self._pending[partition]
        while queue and queue[0][1]:
            queue.popleft()[0].ack()

    async def join(self) -> None:
        """Wait for every handler started so far."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


HIGH, LOW = 0, 1


class PriorityLimiter:
    """A counting semaphore whose high-priority waiters are always served first."""

    def __init__(self, limit: int) -> None:
        self._free = limit
        self._waiters: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (deque(), deque())

    @property
    def high_waiting(self) -> int:
        """High-priority callers waiting for a slot."""
        return sum(1 for f in self._waiters[HIGH] if not f.done())

    @asynccontextmanager
    async def slot(self, priority: int) -> AsyncIterator[None]:
        """Hold one slot for the duration of the block."""
        await self._acquire(priority)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, priority: int) -> None:
        if self._free > 0 and not any(self._waiters):
            self._free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[priority].append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # the slot was handed over just as we were cancelled
            raise

    def _release(self) -> None:
        for queue in self._waiters:
            while queue:
                future = queue.popleft()
                if not future.done():
                    future.set_result(None)  # hand the slot over directly
                    return
        self._free += 1
