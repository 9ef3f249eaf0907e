"""Backend slots: at most the adaptive limit in flight, handed out by priority (asyncio).

Priorities, first served first: `DUE` (retries whose time has come), then fresh requests
of priority `HIGH`, `NORMAL` (no priority given) and `LOW`.

Starvation is bounded by ageing: a fresh request that has watched `max_passes` slots go
to others since it started waiting is served next, before any fresher request of a
higher priority (due retries still come first). So under a flood of `high` traffic a
`low` request at the head of its queue waits at most `max_passes` grants.

A due retry may take its slot ahead of its due time and hold it idle until then
(`hold_until`): under a flood of fresh input every slot is busy, and asking only when due
meant waiting for the next call to end. Such a slot is lent, not owned: a due retry that
finds no free slot takes it from the holder whose time is furthest off, when that is later
than its own, and the holder asks again at its own time. In a burst of retries due
together, slots held idle by retries not yet due had kept retries already due waiting for
a call to end (90-280 ms at 100 ms calls, measured by stage).

The limit is `AimdLimit.limit` when adaptive (`record` feeds it every call's outcome),
else the fixed ceiling. When it shrinks, calls in flight finish; no new slot is handed
out until fewer than the limit are in flight.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dlqapp.flowcontrol.aimd import AimdLimit

DUE, HIGH, NORMAL, LOW = 0, 1, 2, 3
PRIORITIES = {"high": HIGH, "normal": NORMAL, "low": LOW}
"""Request field `priority` → slot priority."""
MAX_PASSES = 32


@dataclass
class _Early:
    """A slot held ahead of `at_ms`; `taken` resolves when a due retry took it meanwhile."""

    at_ms: int
    taken: asyncio.Future[None]


@dataclass
class _Waiter:
    future: asyncio.Future[None]
    since_grant: int
    order: int
    due_at: int | None = None
    """A due retry's due time (epoch ms); None: due now."""


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
        self._early: list[_Early] = []

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

    def slot(self, priority: int, due_at: int | None = None) -> _Slot:
        """Hold one slot for the duration of the `async with` block; `due_at`: a due retry's
        due time, when it asks ahead of it (see `hold_until`)."""
        return _Slot(self, priority, due_at)

    def is_slow(self, latency_s: float) -> bool:
        """A call this slow counts as push-back (`AimdLimit.is_slow`; never without adaptive concurrency)."""
        return self.adaptive is not None and self.adaptive.is_slow(latency_s)

    def record(self, latency_s: float, dropped: bool) -> None:
        """One call's outcome (call while still holding its slot): moves the adaptive limit."""
        if self.adaptive is not None:
            self.adaptive.on_sample(latency_s, dropped, self.in_use)
            self._dispatch()

    async def _acquire(self, priority: int, due_at: int | None = None) -> None:
        if self.in_use < self.limit and not any(self._waiters):
            self._grant()  # a free slot and nobody before us: no future, no wait
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._enqueued += 1
        self._waiters[priority].append(_Waiter(future, self.grants, self._enqueued, due_at))
        self._dispatch()
        if priority == DUE and not future.done():
            self._lend_early()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # the slot was handed over just as we were cancelled
            raise

    async def hold_until(self, clock: Callable[[], int], at_ms: int) -> None:
        """Holding a slot, wait until `clock` reads `at_ms`; a due retry that finds no free slot
        meanwhile takes this one, and the slot is asked for again (as due) at `at_ms`."""
        if at_ms - clock() <= 0:
            return
        early = _Early(at_ms, asyncio.get_running_loop().create_future())
        self._early.append(early)
        self._lend_early()  # due retries already waiting come first
        try:
            while (left_ms := at_ms - clock()) > 0 and not early.taken.done():
                await asyncio.wait((early.taken,), timeout=left_ms / 1000)
            if early.taken.done():
                while (left_ms := at_ms - clock()) > 0:
                    await asyncio.sleep(left_ms / 1000)
                await self._acquire(DUE, at_ms)  # the `async with` block releases it as ever
        except BaseException:
            if early.taken.done():
                self.in_use += 1  # lent away and not taken back: the block's release must balance
            raise
        finally:
            if early in self._early:
                self._early.remove(early)

    def _lend_early(self) -> None:
        """Give slots held early to the due retries waiting in line, each from the holder
        whose time is furthest off, when that is later than the waiter's own."""
        queue = self._waiters[DUE]
        while self._early:
            while queue and queue[0].future.done():
                queue.popleft()
            if not queue:
                return
            waiter = queue[0]
            early = max(self._early, key=lambda e: e.at_ms)
            if waiter.due_at is not None and early.at_ms <= waiter.due_at:
                return  # every holder is due before the first in line: it keeps its slot
            queue.popleft()
            self._early.remove(early)
            early.taken.set_result(None)
            self.grants += 1
            waiter.future.set_result(None)  # the slot changes hands: in_use unchanged

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

    __slots__ = ("_due_at", "_limiter", "_priority")

    def __init__(self, limiter: SlotLimiter, priority: int, due_at: int | None = None) -> None:
        self._limiter = limiter
        self._priority = priority
        self._due_at = due_at

    async def __aenter__(self) -> None:
        await self._limiter._acquire(self._priority, self._due_at)

    async def __aexit__(self, *exc: Any) -> None:
        self._limiter._release()
