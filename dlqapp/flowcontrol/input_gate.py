"""Due retries ahead of fresh input at every stage, not only for backend slots.

A due retry travels from the timer to the due agent through the `due` topic, on the same
consumer that reads `input`. Under an input flood that consumer is busy with input: the
fetcher hands over input records in batches, Faust buffers thousands of them per stream,
and the handlers they start keep the event loop busy. Measured on a loaded 2-core
machine, a due hint then waited 10 s at the median (up to 200 s) before the due agent saw
it, although once there it got a backend slot within milliseconds.

So while any due hint is on its way, the gate is closed: the input partitions are paused
at the consumer (nothing more is fetched or buffered for them) and the input agent starts
no new handler (it keeps taking events off its queue, though: see
dlqapp.processing.feed.GatedFeed). Fresh requests already running carry on; they rank
below retries for backend slots anyway (dlqapp.flowcontrol.slots). The gate opens again
as soon as the last hint has arrived, or after `max_hold_ms` (a hint lost to a crash must
not stall input; the timer fires it again later).

The gate stays open while the circuit breaker is not closed: fresh requests are the
breaker's probes (dlqapp.core.breaker), and retries must not be spent probing an outage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable

from dlqapp.core.clock import Clock

DEFAULT_MAX_HOLD_MS = 2_000
RETRY_APPLY_S = 0.1

SetPaused = Callable[[bool], Awaitable[None]]
"""Pauses (True) or resumes (False) fetching of the input partitions."""


class InputGate:
    """Closed while due hints are on their way to the due agent (and the breaker is closed).

    `refresh()` decides; `run(set_paused)` (a worker service) carries the decision to the
    consumer; `wait_open()` holds the input agent.
    """

    def __init__(
        self, breaker_closed: Callable[[], bool], clock: Clock, max_hold_ms: int = DEFAULT_MAX_HOLD_MS
    ) -> None:
        self._breaker_closed = breaker_closed
        self._clock = clock
        self._max_hold_ms = max_hold_ms
        self._in_hop: dict[bytes, int] = {}  # due key -> when it was fired, oldest first
        self._open = asyncio.Event()
        self._open.set()
        self._closed = asyncio.Event()
        self._changed = asyncio.Event()
        self._input_busy: Callable[[], bool] = lambda: True
        self.holds = 0

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    @property
    def in_hop(self) -> int:
        """Due hints fired and not yet seen by the due agent."""
        return len(self._in_hop)

    def handed_over(self, keys: Iterable[bytes]) -> None:
        """The timer handed these due keys to the due hop."""
        now = self._clock()
        for key in keys:
            self._in_hop.pop(key, None)
            self._in_hop[key] = now
        self.refresh()

    def received(self, key: bytes) -> None:
        """The due agent picked up this key's hint."""
        if self._in_hop.pop(key, None) is not None and not self._in_hop:
            self.refresh()

    def forget(self) -> None:
        """After a rebalance the hints in flight may belong to another worker now."""
        self._in_hop.clear()
        self.refresh()

    def refresh(self) -> None:
        """Open or close the gate for what is in the hop now."""
        self._drop_stale()
        if self._in_hop and self._breaker_closed():
            if self._open.is_set():
                self._open.clear()
                self._closed.set()
                self.holds += 1
            self._changed.set()  # also while closed: a rebalance resumes newly assigned partitions
        elif not self._open.is_set():
            self._open.set()
            self._closed.clear()
            self._changed.set()

    def pause_fetching_when(self, input_busy: Callable[[], bool]) -> None:
        """Pause fetching only when `input_busy()` says input is backlogged as the gate closes.

        On a quiet worker a pause saves nothing and costs a refetch (aiokafka drops the
        records it prefetched for paused partitions); the feed holds input back anyway."""
        self._input_busy = input_busy

    def reconsider(self) -> None:
        """Apply the decision again (input became busy while the gate was closed)."""
        self._changed.set()

    async def wait_open(self) -> None:
        """Return once fresh input may start another handler."""
        if not self._open.is_set():
            await self._open.wait()

    async def wait_closed(self) -> None:
        """Return once the gate is closed."""
        await self._closed.wait()

    async def run(self, set_paused: SetPaused) -> None:
        """Carry each decision to the consumer (runs for the life of the worker).

        A decision that could not be applied (the consumer mid-rebalance) is tried again
        until it is: input left paused by a failed resume would never be read again.
        """
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                await set_paused(not self._open.is_set() and self._input_busy())
            except Exception:
                self._changed.set()
                await asyncio.sleep(RETRY_APPLY_S)

    def _drop_stale(self) -> None:
        """Hints older than max_hold_ms no longer hold input back (the timer re-fires lost ones)."""
        cutoff = self._clock() - self._max_hold_ms
        while self._in_hop:
            key, fired_at = next(iter(self._in_hop.items()))
            if fired_at > cutoff:
                return
            del self._in_hop[key]
