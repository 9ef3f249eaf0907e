"""Concurrency without losing an event: in-flight windows, and the gated input feed.

Every agent hands its events to an `InFlightWindow`: each event runs in a stream step of
its own (dlqapp.tables.steps), many at once up to the window's limit, and is acked by the
one ack rule (dlqapp.kafka.acks) once its step committed and every earlier event of its
partition was acked. What happens when a step fails is decided by its error's class
(dlqapp.core.errors), here and nowhere else:

- `HandBack`: the event goes back unacked, quietly (its partition was handed back);
- `StopWorker`: the worker stops (restarts in place under exactly_once), the event unacked;
- `Poison` or any other exception: the event is dead-lettered as `poison` in a step of its
  own (`on_poison`) and acked like any other; if that fails too, the worker stops.

`SlotLimiter` (dlqapp.flowcontrol.slots) bounds backend calls and serves due retries
before fresh input.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from dlqapp.core.errors import HandBack, StopWorker
from dlqapp.flowcontrol.fair import FairQueue
from dlqapp.flowcontrol.input_gate import InputGate
from dlqapp.kafka.acks import Acks, Ticket
from dlqapp.processing.crashguard import CrashGuard, PoisonMessage
from dlqapp.tables.progress import Progress
from dlqapp.tables.steps import StreamSteps

log = logging.getLogger(__name__)

STRIKES_TO_POISON = 2
"""A record that broke this many transactions (on any worker) is dead-lettered as `poison`
instead of being handled again."""

Handler = Callable[[], Awaitable[object]]
"""Handles one event inside its step; what it returns goes to `on_done` (an operator's answer)."""
OnPoison = Callable[[Ticket, BaseException], Awaitable[object]]
"""Dead-letters the event of a step that failed (inside a step of its own); what it returns
goes to `on_done` like a handler's answer."""
OnDone = Callable[[Ticket, object], Awaitable[None]]
"""Called once an event's step committed, with what its handler returned."""


class InFlightWindow:
    """At most `limit` steps running; each event acked by the one ack rule (module doc)."""

    def __init__(
        self,
        limit: int,
        *,
        steps: StreamSteps,
        acks: Acks,
        on_poison: OnPoison,
        on_stop: Callable[[BaseException], None],
        guard: CrashGuard | None = None,
        on_done: OnDone | None = None,
        progress: Progress | None = None,
    ) -> None:
        self._slots = asyncio.Semaphore(limit)
        self._progress = progress
        self._steps = steps
        self._acks = acks
        self._on_poison = on_poison
        self._on_stop = on_stop
        self._guard = guard
        self._on_done = on_done
        self._tasks: set[asyncio.Task[None]] = set()
        self._running: dict[asyncio.Task[None], Ticket] = {}
        self._accepting = asyncio.Event()
        self._accepting.set()
        self._generation = 0

    @property
    def in_flight(self) -> int:
        """Steps running now."""
        return len(self._running)

    @property
    def has_room(self) -> bool:
        """A step can start now without waiting."""
        return not self._slots.locked()

    async def wait_for_room(self) -> None:
        """Until a step can start (a feed chooses its next event only then)."""
        while self._slots.locked():
            await self._slots.acquire()
            self._slots.release()
            await asyncio.sleep(0)

    @property
    def accepting(self) -> bool:
        """False while the window is being released (or after a shutdown)."""
        return self._accepting.is_set()

    @property
    def generation(self) -> int:
        """Bumped by every release: an event received before it belongs to an old assignment."""
        return self._generation

    async def submit(
        self,
        ticket: Ticket,
        handler: Handler,
        *,
        context: contextvars.Context | None = None,
        generation: int | None = None,
    ) -> None:
        """Start `handler()` for the ticket's event; waits while the window is full.

        The task runs in `context`, by default a copy of the caller's, so Faust's
        `current_event()` refers to the event inside the handler. An event received in an
        older `generation` (default: now), submitted while the window is being released (or
        after a shutdown), or released while it waited, is handed back unacked: after a
        rebalance its partition was sought back to the committed offset."""
        if generation is None:
            generation = self._generation
        if generation == self._generation and self._accepting.is_set():
            await self._slots.acquire()
            if generation == self._generation and self._accepting.is_set():
                task = asyncio.create_task(self._run(ticket, handler), context=context)
                self._tasks.add(task)
                self._running[task] = ticket
                task.add_done_callback(self._finished)
                return
            self._slots.release()
        self._acks.hand_back(ticket)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._running.pop(task, None)

    async def _run(self, ticket: Ticket, handler: Handler) -> None:
        try:
            outcome = await self._step(ticket, handler)
        except asyncio.CancelledError:
            self._acks.hand_back(ticket)  # released: the partition's next owner handles it
            raise
        finally:
            self._slots.release()
        if outcome is None:
            return
        committed, answer = outcome  # the ticket ended inside its step (`on_end`)
        if self._on_done is not None:
            await self._when_committed(committed, lambda: self._on_done(ticket, answer))  # type: ignore[misc]

    async def _step(self, ticket: Ticket, handler: Handler) -> tuple[asyncio.Future[None] | None, object] | None:
        """Run the handler in a step; route a failure by its class. None: the event is not done."""
        try:
            try:
                async with self._steps.step(ticket.partition, ticket.position, self._ended(ticket)) as step:
                    answer = await self._handle(ticket, handler)
                return step.committed, answer
            except (HandBack, StopWorker):
                raise
            except Exception as exc:  # this record's failure (Poison, or a bug): dead-letter it, move on
                async with self._steps.step(ticket.partition, on_end=self._ended(ticket)) as step:
                    answer = await self._on_poison(ticket, exc)
                    if ticket.strikes and self._progress is not None:
                        self._progress.clear_strike(ticket.topic_partition[0], ticket.offset)
                return step.committed, answer
        except HandBack:  # its partition was handed back meanwhile: the next owner handles it
            self._acks.hand_back(ticket)
        except StopWorker as exc:
            self._on_stop(exc)
        except Exception as exc:  # dead-lettering failed too: never ack, stop
            log.exception("a step failed and its event could not be dead-lettered; the worker stops")
            self._on_stop(exc)
        return None

    def _ended(self, ticket: Ticket) -> Callable[[asyncio.Future[None] | None], None]:
        """What the step calls once its work is in its transaction: the ticket has ended."""
        return lambda committed: self._acks.ended(ticket, committed)

    async def _handle(self, ticket: Ticket, handler: Handler) -> object:
        """The handler, unless the crash-loop guard names the event poison; alone when it asks for care."""
        if ticket.strikes >= STRIKES_TO_POISON:
            raise PoisonMessage(
                f"its transaction failed {ticket.strikes} times (its step failed after its first output, "
                "or the broker refused what it sent)"
            )
        if self._guard is None:
            return await handler()
        position = ticket.position
        if self._guard.is_poison(position):
            raise PoisonMessage(
                f"the worker died {self._guard.crashes(position)} times in a row while handling this message "
                "(DLQ_POISON_AFTER_CRASHES)"
            )
        self._guard.seen(position)
        try:
            if self._guard.needs_care(position):
                async with self._guard.careful(position):
                    return await handler()
            return await handler()
        finally:
            self._guard.finished(position)

    async def _when_committed(
        self, committed: asyncio.Future[None] | None, then: Callable[[], Awaitable[None]]
    ) -> None:
        if committed is not None:
            try:
                await asyncio.shield(committed)
            except BaseException:  # not committed: the worker restarts, nothing to say
                return
        await then()

    def hand_back(self, ticket: Ticket) -> None:
        """Give the ticket's event back unacked without starting it."""
        self._acks.hand_back(ticket)

    async def join(self) -> None:
        """Wait for every step started so far."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def release(self, grace_s: float) -> int:
        """Give back every event whose step has not ended (shutdown, rebalance). Returns how many.

        Running steps get `grace_s` to finish; the rest (held by the breaker, waiting for a
        slot, or in a long call) are cancelled and their events handed back unacked: their
        offsets are never committed, so the next owner of the partition handles them again.
        The window stays closed until `reopen` (the next assignment): every event taken
        until then belongs to the assignment being revoked and is handed back too, never
        started, so nothing runs for a partition this worker may no longer own."""
        self._accepting.clear()
        self._generation += 1
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=grace_s)
        pending = list(self._tasks)
        released = len(pending)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return released

    def reopen(self) -> None:
        """Accept events again: a new assignment has begun."""
        self._accepting.set()


class GatedFeed:
    """Events from a Faust stream to a window, started only while a gate is open, each tenant
    in its fair turn.

    Faust's consumer hands the records of every topic to the agents in one loop, and that
    loop stops whenever an agent's queue is full. An input agent that stopped taking
    events while the input gate is closed would, with its queue full (any flood), hold
    back the very due hints the gate is waiting for, until the gate's maximum hold. So the
    agent always takes its events at once (`put`); the feed keeps them, and `run` submits
    them while the gate is open. While the gate is open `put` waits once `open_limit`
    events wait (the read-ahead: back-pressure); while it is closed, only at `closed_limit`
    (input fetching is paused then, so only what was already fetched can arrive).

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
        weight_of: Callable[[str], float] = lambda tenant: 1.0,
    ) -> None:
        self._window = window
        self._gate = gate
        self._open_limit = open_limit
        self._closed_limit = max(closed_limit, open_limit)
        self._window_limit = window_limit or open_limit
        self._held: FairQueue[tuple[Ticket, Handler, contextvars.Context, int]] = FairQueue(weight_of)
        self._more = asyncio.Event()
        self._room = asyncio.Event()
        self._submitting = False

    backlog_at = 100
    """Waiting events that make input count as backlogged (see `backlogged`)."""

    @property
    def waiting(self) -> int:
        return len(self._held)

    def waiting_by_tenant(self) -> dict[str, int]:
        return self._held.by_tenant()

    def backlogged(self) -> bool:
        """Input arrives faster than it starts: waiting events pile up, or the window is half full."""
        return len(self._held) >= self.backlog_at or self._window.in_flight * 2 >= self._window_limit

    async def put(self, ticket: Ticket, handler: Handler, tenant: str = "", cost: float = 1.0) -> None:
        """Keep the ticket's event (with the caller's context) until the gate and its tenant's
        turn let it start; `cost` is its estimated tokens.

        An event taken while the window is being released belongs to the assignment being
        revoked: it is handed back at once."""
        if not self._window.accepting:
            self._window.hand_back(ticket)
            return
        if not self._held and not self._submitting and self._gate.is_open and self._window.has_room:
            await self._window.submit(ticket, handler)  # nothing before it: start it now, no hop
            return
        self._held.put((ticket, handler, contextvars.copy_context(), self._window.generation), tenant, cost)
        self._more.set()
        if len(self._held) == self.backlog_at and not self._gate.is_open:
            self._gate.reconsider()  # input piles up behind the closed gate: time to pause fetching
        while len(self._held) >= (self._open_limit if self._gate.is_open else self._closed_limit):
            self._room.clear()
            waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._room.wait())]
            if self._gate.is_open:
                waits.append(asyncio.ensure_future(self._gate.wait_closed()))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()

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
            ticket, handler, context, generation = self._held.take()
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
        self._room.set()
        return released


class InFlightWindows:
    """The worker's in-flight windows, created and released together, and the door every
    agent's events come through (`admit`)."""

    def __init__(
        self,
        limit: int,
        drain_timeout_s: float,
        *,
        steps: StreamSteps,
        acks: Acks,
        progress: Progress | None,
        guard: CrashGuard | None,
    ) -> None:
        self.limit = limit
        self.drain_timeout_s = drain_timeout_s
        self.steps = steps
        self.acks = acks
        self.progress = progress
        self.guard = guard
        self._windows: list[InFlightWindow] = []
        self._feeds: list[GatedFeed] = []

    def admit(self, event: object) -> Ticket | None:
        """The door: track `event` for its ack; None when its outputs are already committed
        (exactly_once: below its topic's progress), acked without being handled again."""
        ticket = self.acks.track(event)
        if self.progress is not None:
            topic, partition = ticket.topic_partition
            if self.progress.already_done(topic, partition, ticket.offset):
                self.acks.ended(ticket, None)
                return None
            ticket.strikes = self.progress.strikes(topic, partition, ticket.offset)
        return ticket

    def new(
        self,
        on_poison: OnPoison,
        on_stop: Callable[[BaseException], None],
        *,
        limit: int | None = None,
        on_done: OnDone | None = None,
    ) -> InFlightWindow:
        """A window of `limit` steps (default: the windows' limit)."""
        window = InFlightWindow(
            limit or self.limit,
            steps=self.steps,
            acks=self.acks,
            on_poison=on_poison,
            on_stop=on_stop,
            guard=self.guard,
            on_done=on_done,
            progress=self.progress,
        )
        self._windows.append(window)
        return window

    def feed(
        self,
        window: InFlightWindow,
        gate: InputGate,
        *,
        closed_limit: int,
        read_ahead: int | None = None,
        weight_of: Callable[[str], float] = lambda tenant: 1.0,
    ) -> GatedFeed:
        """A gated, fair feed into `window`, released with it (see GatedFeed); `read_ahead`:
        the events it may hold while the window is full (default: the window's limit)."""
        feed = GatedFeed(
            window,
            gate,
            open_limit=max(read_ahead or self.limit, self.limit),
            closed_limit=closed_limit,
            window_limit=self.limit,
            weight_of=weight_of,
        )
        self._feeds.append(feed)
        return feed

    @property
    def in_flight(self) -> int:
        return sum(window.in_flight for window in self._windows)

    async def release(self) -> int:
        """Hand back what every window and feed holds (see InFlightWindow.release); they
        stay closed until `reopen`.

        The feeds last: their agents may take events while the windows give running steps
        their grace period, and those belong to the assignment being revoked."""
        released = 0
        for window in self._windows:
            released += await window.release(self.drain_timeout_s)
        released += sum(feed.release() for feed in self._feeds)
        return released + self.acks.hand_back_running()

    def reopen(self) -> None:
        """A new assignment has begun: the door forgets the old one, the windows take events again."""
        self.acks.reset()
        if self.progress is not None:
            self.progress.reset()
        for window in self._windows:
            window.reopen()
