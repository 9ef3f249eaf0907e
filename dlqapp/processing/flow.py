"""Concurrency without losing an event: the in-flight window.

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

from dlqapp.core.errors import HandBack, StopWorker
from dlqapp.kafka.acks import Acks, Ticket
from dlqapp.processing.crashguard import CrashGuard, PoisonMessage, wait_written
from dlqapp.tables.progress import Progress
from dlqapp.tables.step import Step
from dlqapp.tables.steps import StreamSteps

log = logging.getLogger(__name__)

RELEASE_POLL_S = 0.05
"""How often a release looks for steps that have come to wait (and are handed back at once)."""

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
        self._step_of: dict[asyncio.Task[None], Step] = {}
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
        self._step_of.pop(task, None)

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
                    task = asyncio.current_task()
                    if task is not None:
                        self._step_of[task] = step
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
        naming = self._guard.seen(position)
        try:
            if naming is not None:  # its partition's first journal write is under way: named before it runs
                await wait_written(naming)
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

        A step only waiting to call its backend (held by the breaker or waiting for a backend
        slot; `Step.only_waiting`) is cancelled at once, whenever it comes to
        wait. Running steps get `grace_s` to finish; the rest (in a long call) are cancelled.
        A cancelled step's event is handed back unacked: its offset is never committed, so
        the next owner of the partition handles it again. The window stays closed until
        `reopen` (the next assignment): every event taken until then belongs to the
        assignment being revoked and is handed back too, never started, so nothing runs
        for a partition this worker may no longer own."""
        self.close()
        self._generation += 1
        cancelled: set[asyncio.Task[None]] = set()
        deadline = asyncio.get_running_loop().time() + grace_s
        while self._tasks:
            cancelled |= self._cancel_waiting()
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            await asyncio.wait(list(self._tasks), timeout=min(left, RELEASE_POLL_S))
        pending = list(self._tasks)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return len(cancelled | set(pending))

    def _cancel_waiting(self) -> set[asyncio.Task[None]]:
        """Cancel the steps only waiting to call (see `release`)."""
        waiting = {task for task, step in self._step_of.items() if step.only_waiting and not task.done()}
        for task in waiting:
            task.cancel()
            del self._step_of[task]
        return waiting

    def close(self) -> None:
        """Start no step from now on: the worker is about to restart or stop. Steps running go
        on (their transactions may still commit); every event submitted is handed back."""
        self._accepting.clear()

    def reopen(self) -> None:
        """Accept events again: a new assignment has begun."""
        self._accepting.set()
