"""A queue shared between tenants by weighted fair queuing (start-time fair queuing, in tokens).

Each item is stamped on arrival with a start tag `S = max(V, F[tenant])`, and its tenant's
finish tag moves to `F[tenant] = S + cost / weight`; `take` serves the item with the smallest
start tag (the earliest on a tie) and the virtual time `V` becomes its tag. A tenant with
20,000 items queued gets its weight's share of what is taken, not all of it, and a tenant
that arrives later is served within one round. With one tenant this is first in, first out.
The same rule shares backend slots (dlqapp.flowcontrol.slots).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    """Items queued per tenant, taken by start tag (module doc)."""

    def __init__(self, weight_of: Callable[[str], float] = lambda tenant: 1.0) -> None:
        self._weight_of = weight_of
        self._queues: dict[str, deque[tuple[float, int, T]]] = {}
        self._finish: dict[str, float] = {}
        self._vtime = 0.0
        self._order = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def put(self, item: T, tenant: str, cost: float) -> None:
        """Queue `item` of `tenant`, which will cost about `cost` (tokens)."""
        start = max(self._vtime, self._finish.get(tenant, 0.0))
        self._finish[tenant] = start + max(cost, 1.0) / max(self._weight_of(tenant), 1e-6)
        queue = self._queues.get(tenant)
        if queue is None:
            queue = self._queues[tenant] = deque()
        queue.append((start, self._order, item))
        self._order += 1
        self._size += 1

    def take(self) -> T:
        """The item with the smallest start tag; IndexError when empty."""
        if not self._size:
            raise IndexError("take from an empty FairQueue")
        tenant = min(self._queues, key=lambda t: self._queues[t][0][:2])
        queue = self._queues[tenant]
        start, _, item = queue.popleft()
        if not queue:
            del self._queues[tenant]
        self._vtime = max(self._vtime, start)
        if len(self._finish) > len(self._queues) + 64:  # forget tenants the virtual time has passed
            self._finish = {t: f for t, f in self._finish.items() if f > self._vtime or t in self._queues}
        self._size -= 1
        return item

    def drain(self) -> Iterator[T]:
        """Every item, in queue order per tenant, emptying the queue."""
        for queue in self._queues.values():
            for _, _, item in queue:
                yield item
        self._queues.clear()
        self._size = 0

    def by_tenant(self) -> dict[str, int]:
        return {tenant: len(queue) for tenant, queue in self._queues.items()}
