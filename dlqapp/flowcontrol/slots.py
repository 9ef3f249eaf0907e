"""Backend slots: at most the adaptive limit in flight, handed out by priority (asyncio).

Priorities, first served first: `DUE` (retries whose time has come), then fresh requests
of priority `HIGH`, `NORMAL` (no priority given) and `LOW`.

Within a priority, slots are shared between tenants by weighted fair queuing (start-time
fair queuing, in tokens): each waiter is stamped on arrival with a start tag
`S = max(V, F[tenant])` and its tenant's finish tag moves to `F[tenant] = S + cost / weight`
(cost: the call's estimated tokens; weight: `DLQ_TENANT_WEIGHTS`, 1 by default); the waiter
with the smallest start tag is served next, and the class's virtual time `V` becomes its tag.
So a tenant with a thousand calls waiting gets its weight's share of the slots, not all of
them, and a tenant that arrives later is served within one round, not after the backlog. With
one tenant this is first come, first served.

Starvation is bounded by ageing: when a fresh request has watched `max_passes` slots go
to others since it started waiting, its priority is served next, before any fresher
request of a higher priority (due retries still come first), its tenants sharing that
slot fairly. So under a flood of `high` traffic `low` requests get at least one grant in
`max_passes`.

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
from collections.abc import Callable, Mapping
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
    tag: float = 0.0
    """The start tag (weighted fair queuing)."""
    due_at: int | None = None
    """A due retry's due time (epoch ms); None: due now."""


@dataclass
class _Early:
    """A slot held ahead of `at_ms`; `taken` resolves when a due retry took it meanwhile."""

    at_ms: int
    taken: asyncio.Future[None]


class _FairClass:
    """The waiters of one priority, queued per tenant and served by start tag (module doc)."""

    __slots__ = ("finish", "queues", "vtime")

    def __init__(self) -> None:
        self.queues: dict[str, deque[_Waiter]] = {}
        self.finish: dict[str, float] = {}
        self.vtime = 0.0

    def stamp(self, tenant: str, cost: float, weight: float) -> float:
        """The start tag of a call of `tenant` arriving now; moves the tenant's finish tag."""
        start = max(self.vtime, self.finish.get(tenant, 0.0))
        self.finish[tenant] = start + max(cost, 1.0) / max(weight, 1e-6)
        return start

    def add(self, tenant: str, waiter: _Waiter) -> None:
        queue = self.queues.get(tenant)
        if queue is None:
            queue = self.queues[tenant] = deque()
        queue.append(waiter)

    def heads(self) -> list[tuple[str, _Waiter]]:
        """The first live waiter of each tenant (done ones dropped)."""
        heads = []
        for tenant in list(self.queues):
            queue = self.queues[tenant]
            while queue and queue[0].future.done():
                queue.popleft()
            if queue:
                heads.append((tenant, queue[0]))
            else:
                del self.queues[tenant]
                if self.finish.get(tenant, 0.0) <= self.vtime:
                    self.finish.pop(tenant, None)  # no credit or debt left to remember
        return heads

    def oldest(self) -> _Waiter | None:
        heads = self.heads()
        return min((w for _, w in heads), key=lambda w: w.order) if heads else None

    def peek(self) -> _Waiter | None:
        """The waiter `take` would serve next, left in place."""
        heads = self.heads()
        return min((w for _, w in heads), key=lambda w: (w.tag, w.order)) if heads else None

    def take(self) -> _Waiter | None:
        """Serve the waiter with the smallest start tag (the earliest on a tie)."""
        heads = self.heads()
        if not heads:
            return None
        tenant, waiter = min(heads, key=lambda h: (h[1].tag, h[1].order))
        self.queues[tenant].popleft()
        self.vtime = max(self.vtime, waiter.tag)
        return waiter

    def waiting(self) -> int:
        return sum(1 for queue in self.queues.values() for w in queue if not w.future.done())

    def by_tenant(self) -> dict[str, int]:
        counts = {t: sum(1 for w in q if not w.future.done()) for t, q in self.queues.items()}
        return {t: n for t, n in counts.items() if n}

    def __bool__(self) -> bool:
        return any(self.queues.values())


class SlotLimiter:
    """A counting semaphore with priorities, ageing, and a limit that may move."""

    def __init__(
        self,
        limit: int,
        adaptive: AimdLimit | None = None,
        max_passes: int = MAX_PASSES,
        weights: Mapping[str, float] | None = None,
    ) -> None:
        """`weights`: each tenant's weight for fair shares (1 for a tenant not named)."""
        self.ceiling = limit
        self.weights = dict(weights or {})
        self.adaptive = adaptive
        self.max_passes = max_passes
        self.in_use = 0
        self.grants = 0
        self._enqueued = 0
        self._waiters: tuple[_FairClass, ...] = tuple(_FairClass() for _ in range(LOW + 1))
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
        return self._waiters[priority].waiting()

    def waiting_by_tenant(self) -> dict[str, int]:
        """Calls waiting for a slot, per tenant (every priority)."""
        total: dict[str, int] = {}
        for fair in self._waiters:
            for tenant, n in fair.by_tenant().items():
                total[tenant] = total.get(tenant, 0) + n
        return total

    def slot(self, priority: int, tenant: str = "", cost: float = 1.0, due_at: int | None = None) -> _Slot:
        """Hold one slot for the duration of the `async with` block; `tenant` and `cost`
        (estimated tokens) place it among the tenants waiting at its priority; `due_at`: a
        due retry's due time, when it asks ahead of it (see `hold_until`)."""
        return _Slot(self, priority, tenant, cost, due_at)

    def is_slow(self, latency_s: float) -> bool:
        """A call this slow counts as push-back (`AimdLimit.is_slow`; never without adaptive concurrency)."""
        return self.adaptive is not None and self.adaptive.is_slow(latency_s)

    def record(self, latency_s: float, dropped: bool) -> None:
        """One call's outcome (call while still holding its slot): moves the adaptive limit."""
        if self.adaptive is not None:
            self.adaptive.on_sample(latency_s, dropped, self.in_use)
            self._dispatch()

    async def _acquire(self, priority: int, tenant: str = "", cost: float = 1.0, due_at: int | None = None) -> None:
        fair = self._waiters[priority]
        tag = fair.stamp(tenant, cost, self.weights.get(tenant, 1.0))
        if self.in_use < self.limit and not any(self._waiters):
            self._grant()  # a free slot and nobody before us: no future, no wait
            fair.vtime = max(fair.vtime, tag)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._enqueued += 1
        fair.add(tenant, _Waiter(future, self.grants, self._enqueued, tag, due_at))
        self._dispatch()
        if priority == DUE and not future.done():
            self._lend_early()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # the slot was handed over just as we were cancelled
            raise

    async def hold_until(self, clock: Callable[[], int], at_ms: int, tenant: str = "", cost: float = 1.0) -> None:
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
                await self._acquire(DUE, tenant, cost, at_ms)  # the `async with` block releases it as ever
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
        due = self._waiters[DUE]
        while self._early:
            waiter = due.peek()
            if waiter is None:
                return
            early = max(self._early, key=lambda e: e.at_ms)
            if waiter.due_at is not None and early.at_ms <= waiter.due_at:
                return  # every holder is due before the first in line: it keeps its slot
            due.take()
            self._early.remove(early)
            early.taken.set_result(None)
            self.grants += 1
            waiter.future.set_result(None)  # the slot changes hands: in_use unchanged

    def _grant(self) -> None:
        self.in_use += 1
        self.grants += 1

    def _release(self) -> bool:
        """Give a slot back; True when it went to a due retry."""
        self.in_use -= 1
        return self._dispatch()

    def _dispatch(self) -> bool:
        """Hand free slots over directly; True when a due retry got one."""
        to_due = False
        while self.in_use < self.limit:
            waiter = self._waiters[DUE].take()
            if waiter is not None:
                to_due = True
            else:
                waiter = self._next_fresh()
                if waiter is None:
                    break
            self._grant()
            waiter.future.set_result(None)
        return to_due

    def _next_fresh(self) -> _Waiter | None:
        """The fresh request to serve: an aged one, then by priority (within a priority, by
        tenant fair shares)."""
        oldest = [(fair, w) for fair in self._waiters[HIGH:] if (w := fair.oldest()) is not None]
        aged = [(fair, w) for fair, w in oldest if self.grants - w.since_grant >= self.max_passes]
        if aged:  # the priority whose oldest waiter waited longest, shared fairly within
            return min(aged, key=lambda pair: pair[1].order)[0].take()
        return oldest[0][0].take() if oldest else None

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

    def tenants_snapshot(self) -> dict[str, dict[str, float]]:
        """Per tenant: calls waiting for a slot and its weight."""
        waiting = self.waiting_by_tenant()
        names = set(waiting) | set(self.weights)
        return {t or "-": {"waiting": waiting.get(t, 0), "weight": self.weights.get(t, 1.0)} for t in sorted(names)}


class _Slot:
    """`async with limiter.slot(priority)`: one slot for the block (a class: no generator per call)."""

    __slots__ = ("_cost", "_due_at", "_limiter", "_priority", "_tenant")

    def __init__(self, limiter: SlotLimiter, priority: int, tenant: str, cost: float, due_at: int | None) -> None:
        self._limiter = limiter
        self._priority = priority
        self._tenant = tenant
        self._cost = cost
        self._due_at = due_at

    async def __aenter__(self) -> None:
        await self._limiter._acquire(self._priority, self._tenant, self._cost, self._due_at)

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: Any) -> None:
        if self._limiter._release() and exc_type is None:
            # The slot went to a due retry: let it start before this call's own follow-up
            # work (its result, its parked retry). Two turns, so that every task woken in
            # this pass of the event loop takes its first turn before any goes on: with 64
            # calls ending in one pass, the last retry handed a slot waited for all 64
            # follow-ups, started late, ended late, and made the next wave of due retries
            # wait for its slot in turn.
            await asyncio.sleep(0)
            await asyncio.sleep(0)
