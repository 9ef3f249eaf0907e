"""The gated input feed: fresh requests wait here while the input gate is closed, and start
in their tenant's fair turn (dlqapp.flowcontrol.fair) when the window has room."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any

from dlqapp.flowcontrol.fair import FairQueue
from dlqapp.flowcontrol.input_gate import InputGate
from dlqapp.kafka.acks import Ticket
from dlqapp.processing.flow import Handler, InFlightWindow


class GatedFeed:
    """Events from a Faust stream to a window, started only while a gate is open, each tenant
    in its fair turn.

    Faust's consumer hands the records of every topic to the agents in one loop, and that
    loop stops whenever an agent's queue is full. An input agent that stopped taking
    events while the input gate is closed would, with its queue full (any flood), hold
    back the very due hints the gate is waiting for, until the gate's maximum hold. So the
    agent always takes its events at once (`put`); the feed keeps them, and `run` submits
    them while the gate is open. While the gate is open `put` waits once `open_limit`
    events wait, or once those waiting hold `open_bytes` (the read-ahead: back-pressure);
    while it is closed, only at `closed_limit` (input fetching is paused then, so only what
    was already fetched can arrive).

    Waiting events are taken by weighted fair queuing between tenants, in tokens
    (dlqapp.flowcontrol.fair): with a read-ahead of thousands, a tenant's request read
    behind another tenant's flood starts within one round, not after the flood. Acks still
    follow offsets (dlqapp.kafka.acks), so only the commit of the flood's offsets waits.
    """

    def __init__(
        self,
        window: InFlightWindow,
        gate: InputGate,
        *,
        open_limit: int,
        closed_limit: int,
        window_limit: int | None = None,
        open_bytes: int | None = None,
        weight_of: Callable[[str], float] = lambda tenant: 1.0,
    ) -> None:
        self._window = window
        self._gate = gate
        self._open_limit = open_limit
        self._closed_limit = max(closed_limit, open_limit)
        self._window_limit = window_limit or open_limit
        self._open_bytes = open_bytes
        self._held: FairQueue[tuple[Ticket, Handler, contextvars.Context, int, int]] = FairQueue(weight_of)
        self._held_bytes = 0
        self._more = asyncio.Event()
        self._room = asyncio.Event()
        self._submitting = False

    backlog_at = 100
    """Waiting events that make input count as backlogged (see `backlogged`)."""

    @property
    def waiting(self) -> int:
        return len(self._held)

    @property
    def waiting_bytes(self) -> int:
        """What the waiting events hold, as `put` was told (`size`)."""
        return self._held_bytes

    def waiting_by_tenant(self) -> dict[str, int]:
        return self._held.by_tenant()

    def backlogged(self) -> bool:
        """Input arrives faster than it starts: waiting events pile up, or the window is half full."""
        return len(self._held) >= self.backlog_at or self._window.in_flight * 2 >= self._window_limit

    async def put(
        self,
        ticket: Ticket,
        handler: Handler,
        tenant: str = "",
        cost: float = 1.0,
        size: int = 0,
        *,
        back_pressure: bool = True,
    ) -> None:
        """Keep the ticket's event (with the caller's context) until the gate and its tenant's
        turn let it start; `cost` is its estimated tokens, `size` the memory it holds meanwhile.
        Without `back_pressure` (a record read ahead of its turn, of a tenant with little
        waiting) it never waits for the read-ahead to have room.

        An event taken while the window is being released belongs to the assignment being
        revoked: it is handed back at once."""
        if not self._window.accepting:
            self._window.hand_back(ticket)
            return
        if not self._held and not self._submitting and self._gate.is_open and self._window.has_room:
            await self._window.submit(ticket, handler)  # nothing before it: start it now, no hop
            return
        self._held.put((ticket, handler, contextvars.copy_context(), self._window.generation, size), tenant, cost)
        self._held_bytes += size
        self._more.set()
        if len(self._held) == self.backlog_at and not self._gate.is_open:
            self._gate.reconsider()  # input piles up behind the closed gate: time to pause fetching
        while back_pressure and self._full():
            self._room.clear()
            waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._room.wait())]
            if self._gate.is_open:
                waits.append(asyncio.ensure_future(self._gate.wait_closed()))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()

    def _full(self) -> bool:
        if not self._gate.is_open:
            return len(self._held) >= self._closed_limit
        return len(self._held) >= self._open_limit or (
            self._open_bytes is not None and self._held_bytes >= self._open_bytes
        )

    async def run(self) -> None:
        """Submit the waiting events, fairly, while the gate is open (a task for the agent's life)."""
        while True:
            if not self._held:
                self._more.clear()
                await self._more.wait()
                continue
            await self._gate.wait_open()
            if not self._held:
                continue
            await self._window.wait_for_room()  # choose the next event only when it can start
            if not self._held:
                continue
            ticket, handler, context, generation, size = self._held.take()
            self._held_bytes -= size
            self._room.set()
            self._submitting = True  # `put` must not start a later event meanwhile
            try:
                await self._window.submit(ticket, handler, context=context, generation=generation)
            finally:
                self._submitting = False

    def release(self) -> int:
        """Hand every waiting event back unacked (a rebalance or a shutdown). Returns how many."""
        released = len(self._held)
        for ticket, *_ in self._held.drain():
            self._window.hand_back(ticket)
        self._held_bytes = 0
        self._room.set()
        return released
