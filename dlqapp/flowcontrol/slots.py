"""Backend slots: at most the adaptive limit in flight, handed out by priority (asyncio).

Priorities, first served first: `DUE` (retries whose time has come), then fresh requests
of priority `HIGH`, `NORMAL` (no priority given) and `LOW`.

Starvation is bounded by ageing: a fresh request that has watched `max_passes` slots go
to others since it started waiting is served next, before any fresher request of a
higher priority (due retries still come first). So under a flood of `high` traffic a
`low` request at the head of its queue waits at most `max_passes` grants.

The limit is `AimdLimit.limit` when adaptive (`record` feeds it every call's outcome),
else the fixed ceiling. When it shrinks, calls in flight finish; no new slot is handed
out until fewer than the limit are in flight.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any

from dlqapp.flowcontrol.aimd import AimdLimit

DUE, HIGH, NORMAL, LOW = 0, 1, 2, 3
PRIORITIES = {"high": HIGH, "normal": NORMAL, "low": LOW}
"""Request field `priority` → slot priority."""
MAX_PASSES = 32


@dataclass
class _Waiter:
    future: asyncio.Future[None]
    since_grant: int
    order: int


class SlotLimiter:
    """A counting semaphore with priorities, ageing, and a limit that may move."""

    def __init__(self, limit: int, adaptive: AimdLimit | None = None, max_passes: int = MAX_PASSES) -> None:
        self.ceiling = limit
        self.adaptive = adaptive
        self.max_passes = max_passes
        self.in_use = 0
        self.grants = 0
        self._enqueued = 0
        self._waiters: tuple[deque[_Waiter], ...] = tuple(deque() for _ in range(LOW + 1))

    @property
    def limit(self) -> int:
        """Calls that may be in flight now."""
        return self.adaptive.limit if self.adaptive is not None else self.ceiling

    @property
    def high_waiting(self) -> int:
        """Due retries waiting for a slot."""
        return self.waiting(DUE)

    def waiting(self, priority: int) -> int:
        return sum(1 for w in self._waiters[priority] if not w.future.done())

    def slot(self, priority: int) -> _Slot:
        """Hold one slot for the duration of the `async with` block."""
        return _Slot(self, priority)

    def is_slow(self, latency_s: float) -> bool:
        """A call this slow counts as push-back (`AimdLimit.is_slow`; never without adaptive concurrency)."""
        return self.adaptive is not None and self.adaptive.is_slow(latency_s)

    def record(self, latency_s: float, dropped: bool) -> None:
        """One call's outcome (call while still holding its slot): moves the adaptive limit."""
        if self.adaptive is not None:
            self.adaptive.on_sample(latency_s, dropped, self.in_use)
            self._dispatch()

    async def _acquire(self, priority: int) -> None:
        if self.in_use < self.limit and not any(self._waiters):
            self._grant()  # a free slot and nobody before us: no future, no wait
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._enqueued += 1
        self._waiters[priority].append(_Waiter(future, self.grants, self._enqueued))
        self._dispatch()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # the slot was handed over just as we were cancelled
            raise

    def _grant(self) -> None:
        self.in_use += 1
        self.grants += 1

    def _release(self) -> None:
        self.in_use -= 1
        self._dispatch()

    def _dispatch(self) -> None:
        while self.in_use < self.limit:
            waiter = self._next()
            if waiter is None:
                return
            self._grant()
            waiter.future.set_result(None)  # hand the slot over directly

    def _next(self) -> _Waiter | None:
        """The waiter to serve: due retries, then an aged fresh request, then by priority."""
        for queue in self._waiters:
            while queue and queue[0].future.done():
                queue.popleft()
        if self._waiters[DUE]:
            return self._waiters[DUE].popleft()
        fresh = [queue for queue in self._waiters[HIGH:] if queue]
        aged = [queue for queue in fresh if self.grants - queue[0].since_grant >= self.max_passes]
        if aged:
            return min(aged, key=lambda queue: queue[0].order).popleft()  # the longest waiting
        return fresh[0].popleft() if fresh else None

    def snapshot(self) -> dict[str, int]:
        """The limit, the ceiling, calls in flight and waiters by priority."""
        return {
            "concurrency_limit": self.limit,
            "concurrency_max": self.ceiling,
            "concurrency_floor": self.adaptive.floor if self.adaptive is not None else self.ceiling,
            "calls_in_flight": self.in_use,
            "waiting_due": self.waiting(DUE),
            "waiting_high": self.waiting(HIGH),
            "waiting_normal": self.waiting(NORMAL),
            "waiting_low": self.waiting(LOW),
        }


class _Slot:
    """`async with limiter.slot(priority)`: one slot for the block (a class: no generator per call)."""

    __slots__ = ("_limiter", "_priority")

    def __init__(self, limiter: SlotLimiter, priority: int) -> None:
        self._limiter = limiter
        self._priority = priority

    async def __aenter__(self) -> None:
        await self._limiter._acquire(self._priority)

    async def __aexit__(self, *exc: Any) -> None:
        self._limiter._release()
