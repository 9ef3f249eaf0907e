"""Concurrency without losing at-least-once: an in-flight window and a priority limiter.

`InFlightWindow` runs one handler task per event, many at once, but acks events of a
partition strictly in offset order: an event is acked only once it and every earlier
event of its partition are done. Faust therefore never sees an out-of-order ack, and
its offset-commit bug with out-of-order acks (faust #606) cannot commit past a message
whose outcome is not yet confirmed.

`SlotLimiter` (dlqapp.flowcontrol.slots) bounds backend calls and serves due retries
before fresh input.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Protocol

from dlqapp.kafka.transactions import NotOwned, TransactionFailed
from dlqapp.processing.crashguard import CrashGuard, PoisonMessage
from dlqapp.tables.durability import changelog_barrier

log = logging.getLogger(__name__)


class Ackable(Protocol):
    def ack(self) -> bool: ...


OnError = Callable[[Any, BaseException], Awaitable[None]]
"""Called with an event whose handler raised; must route it (e.g. to the DLQ) or raise."""


class InFlightWindow:
    """At most `limit` handlers in flight; acks per partition in arrival order.

    A handler that raises is not a reason to stop: `on_error` routes its event (the
    pipeline dead-letters it as `poison`) and the event is acked like any other. Only
    when `on_error` itself fails (the broker is gone) does `on_fatal` stop the worker,
    leaving the event unacked for redelivery.
    """

    def __init__(
        self,
        limit: int,
        on_error: OnError,
        on_fatal: Callable[[BaseException], None],
        forget: Callable[[Any], None] = lambda event: None,
        guard: CrashGuard | None = None,
    ) -> None:
        self._slots = asyncio.Semaphore(limit)
        self._pending: dict[Hashable, deque[list[Any]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._on_error = on_error
        self._on_fatal = on_fatal
        self._forget = forget
        self._guard = guard
        self._accepting = asyncio.Event()
        self._accepting.set()
        self._generation = 0

    @property
    def in_flight(self) -> int:
        """Handlers running now."""
        return len(self._tasks)

    @property
    def has_room(self) -> bool:
        """A handler can start now without waiting."""
        return not self._slots.locked()

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
        partition: Hashable,
        event: Ackable,
        handler: Callable[[], Awaitable[None]],
        *,
        context: contextvars.Context | None = None,
        generation: int | None = None,
    ) -> None:
        """Start `handler()` for `event`; waits while the window is full.

        The task runs in `context`, by default a copy of the caller's, so Faust's
        `current_event()` (and with it table writes) refers to `event` inside the handler.
        An event received in an older `generation` (default: now), submitted while the
        window is being released (or after a shutdown), or released while it waited, is
        given back unacked: after a rebalance its partition was sought back to the
        committed offset, so acking it now could let a commit pass an earlier message.
        """
        if generation is None:
            generation = self._generation
        if generation == self._generation and self._accepting.is_set():
            await self._slots.acquire()
            if generation == self._generation and self._accepting.is_set():
                self._start(partition, event, handler, context)
                return
            self._slots.release()
        self._forget(event)

    def _start(
        self,
        partition: Hashable,
        event: Ackable,
        handler: Callable[[], Awaitable[None]],
        context: contextvars.Context | None,
    ) -> None:
        entry = [event, False]
        self._pending.setdefault(partition, deque()).append(entry)
        task = asyncio.create_task(self._run(partition, entry, handler), context=context)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, partition: Hashable, entry: list[Any], handler: Callable[[], Awaitable[None]]) -> None:
        try:
            try:
                async with changelog_barrier():
                    await self._handle(entry[0], handler)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one message's failure: route it, move on
                async with changelog_barrier():
                    await self._on_error(entry[0], exc)
        except asyncio.CancelledError:
            raise
        except NotOwned:  # exactly_once: its partition was handed back meanwhile; the next owner handles it
            self._forget(entry[0])
            return
        except BaseException as exc:  # routing failed too (or, exactly_once, the step's transaction): never ack, stop
            if not isinstance(
                exc, TransactionFailed
            ):  # that one every step of the transaction sees: the restart says it
                log.exception("handler failed and its event could not be routed; the worker stops")
            self._on_fatal(exc)
            return
        finally:
            self._slots.release()
        entry[1] = True
        self._ack_ready(partition)

    async def _handle(self, event: Any, handler: Callable[[], Awaitable[None]]) -> None:
        """The handler, unless the crash-loop guard names the event poison; alone when it asks for care."""
        if self._guard is None:
            await handler()
            return
        message = event.message
        position = (message.topic, message.partition, message.offset)
        if self._guard.is_poison(position):
            raise PoisonMessage(
                f"the worker died {self._guard.crashes(position)} times in a row while handling this message "
                "(DLQ_POISON_AFTER_CRASHES)"
            )
        self._guard.seen(position)
        if self._guard.needs_care(position):
            async with self._guard.careful(position):
                await handler()
        else:
            await handler()

    def forget(self, event: Any) -> None:
        """Give `event` back unacked without starting it."""
        self._forget(event)

    def _ack_ready(self, partition: Hashable) -> None:
        queue = self._pending.get(partition)
        while queue and queue[0][1]:
            queue.popleft()[0].ack()

    async def join(self) -> None:
        """Wait for every handler started so far."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def release(self, grace_s: float) -> int:
        """Give back every event not yet acked (shutdown, rebalance). Returns how many.

        Running handlers get `grace_s` to finish; the rest (held by the breaker, waiting
        for a slot, or in a long call) are cancelled. Events not acked are handed back
        unacked (`forget`): their offsets are never committed, so the next owner of the
        partition handles them again. The window stays closed until `reopen` (the next
        assignment): every event taken until then belongs to the assignment being revoked
        and is handed back too, never started, so nothing runs for a partition this worker
        may no longer own and Faust's wait for acks ends at once.
        """
        self._accepting.clear()
        self._generation += 1
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=grace_s)
        pending = list(self._tasks)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        released = 0
        for queue in self._pending.values():
            for event, _ in queue:
                self._forget(event)
                released += 1
        self._pending.clear()
        return released

    def reopen(self) -> None:
        """Accept events again: a new assignment has begun."""
        self._accepting.set()


class Gate(Protocol):
    """What a `GatedFeed` needs of dlqapp.flowcontrol.input_gate.InputGate."""

    @property
    def is_open(self) -> bool: ...

    async def wait_open(self) -> None: ...

    async def wait_closed(self) -> None: ...

    def reconsider(self) -> None: ...


class GatedFeed:
    """Events from a Faust stream to a window, started only while a gate is open.

    Faust's consumer hands the records of every topic to the agents in one loop, and that
    loop stops whenever an agent's queue is full. An input agent that stopped taking
    events while the input gate is closed would, with its queue full (any flood), hold
    back the very due hints the gate is waiting for, until the gate's maximum hold. So the
    agent always takes its events at once (`put`); the feed keeps them, in order, and
    `run` submits them while the gate is open. While the gate is open `put` waits once
    `open_limit` events are held (the window is full: back-pressure as before); while it
    is closed, only at `closed_limit` (input fetching is paused then, so only what was
    already fetched can arrive).
    """

    def __init__(self, window: InFlightWindow, gate: Gate, open_limit: int, closed_limit: int) -> None:
        self._window = window
        self._gate = gate
        self._open_limit = open_limit
        self._closed_limit = max(closed_limit, open_limit)
        self._held: deque[tuple[Hashable, Any, Callable[[], Awaitable[None]], contextvars.Context, int]] = deque()
        self._more = asyncio.Event()
        self._room = asyncio.Event()
        self._submitting = False

    backlog_at = 100
    """Held events that make input count as backlogged (see `backlogged`)."""

    @property
    def held(self) -> int:
        return len(self._held)

    def backlogged(self) -> bool:
        """Input arrives faster than it starts: held events pile up, or the window is half full."""
        return len(self._held) >= self.backlog_at or self._window.in_flight * 2 >= self._open_limit

    async def put(self, partition: Hashable, event: Any, handler: Callable[[], Awaitable[None]]) -> None:
        """Keep `event` (with the caller's context, for its table writes) until the gate lets it start.

        An event taken while the window is being released belongs to the assignment being
        revoked: it is given back at once."""
        if not self._window.accepting:
            self._window.forget(event)
            return
        if not self._held and not self._submitting and self._gate.is_open and self._window.has_room:
            await self._window.submit(partition, event, handler)  # nothing before it: start it now, no hop
            return
        self._held.append((partition, event, handler, contextvars.copy_context(), self._window.generation))
        self._more.set()
        if len(self._held) == self.backlog_at and not self._gate.is_open:
            self._gate.reconsider()  # input piles up behind the closed gate: time to pause fetching
        while len(self._held) >= (self._open_limit if self._gate.is_open else self._closed_limit):
            self._room.clear()
            waits: list[asyncio.Future[object]] = [asyncio.ensure_future(self._room.wait())]
            if self._gate.is_open:
                waits.append(asyncio.ensure_future(self._gate.wait_closed()))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()

    async def run(self) -> None:
        """Submit the held events in order while the gate is open (a task for the agent's life)."""
        while True:
            if not self._held:
                self._more.clear()
                await self._more.wait()
                continue
            await self._gate.wait_open()
            if not self._held:
                continue
            partition, event, handler, context, generation = self._held.popleft()
            self._room.set()
            self._submitting = True  # `put` must not start a later event meanwhile
            try:
                await self._window.submit(partition, event, handler, context=context, generation=generation)
            finally:
                self._submitting = False

    def release(self) -> int:
        """Give every held event back unacked (a rebalance or a shutdown). Returns how many."""
        released = len(self._held)
        while self._held:
            self._window.forget(self._held.popleft()[1])
        self._room.set()
        return released


class InFlightWindows:
    """The worker's in-flight windows (input, due), created and released together."""

    def __init__(self, limit: int, drain_timeout_s: float) -> None:
        self.limit = limit
        self.drain_timeout_s = drain_timeout_s
        self._windows: list[InFlightWindow] = []
        self._feeds: list[GatedFeed] = []

    def feed(self, window: InFlightWindow, gate: Gate, closed_limit: int) -> GatedFeed:
        """A gated feed into `window`, released with it (see GatedFeed)."""
        feed = GatedFeed(window, gate, open_limit=self.limit, closed_limit=closed_limit)
        self._feeds.append(feed)
        return feed

    def new(
        self,
        on_error: OnError,
        on_fatal: Callable[[BaseException], None],
        forget: Callable[[Any], None],
        guard: CrashGuard | None,
        limit: int | None = None,
    ) -> InFlightWindow:
        """A window of `limit` handlers (default: the windows' limit)."""
        window = InFlightWindow(limit or self.limit, on_error=on_error, on_fatal=on_fatal, forget=forget, guard=guard)
        self._windows.append(window)
        return window

    @property
    def in_flight(self) -> int:
        return sum(window.in_flight for window in self._windows)

    async def release(self) -> int:
        """Hand back what every window and feed holds (see InFlightWindow.release); they
        stay closed until `reopen`.

        The feeds last: their agents may take events while the windows give running
        handlers their grace period, and those belong to the assignment being revoked."""
        released = 0
        for window in self._windows:
            released += await window.release(self.drain_timeout_s)
        return released + sum(feed.release() for feed in self._feeds)

    def reopen(self) -> None:
        """A new assignment has begun: the windows take events again."""
        for window in self._windows:
            window.reopen()
