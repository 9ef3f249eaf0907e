"""Faust wiring: one agent per topic. Logic lives in the components they call.

Every agent takes its events through the same door (`InFlightWindows.admit`: tracked for the
one ack rule, skipped when its outputs already committed) into an in-flight window: each
event runs in a stream step of its own and is acked only after that step committed and
every earlier event of its partition was acked (dlqapp.processing.flow).

- `input` and `due`: many steps at once; a step that fails dead-letters its record as `poison`.
- one agent per retry tier: parks what lands on the tier topic, many at once (each park
  waits for its changelog write; one at a time, a burst of 300 failures took 2 s to park,
  and retries of the last ones fell due before they were parked).
- `dlq`: records every dead letter, one at a time; `operator`: replays, discards, expiries,
  one at a time, each answered (`ask()`) once its step committed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from faust import EventT, Stream, StreamT
from faust.types import AgentT

from dlqapp.core.budgets import may_name_a_tenant
from dlqapp.core.errors import ErrorClass
from dlqapp.core.record import Record
from dlqapp.kafka.acks import Ticket
from dlqapp.kafka.faust_agents import asked_value
from dlqapp.kafka.records import TailEvent, record_of
from dlqapp.kafka.replies import Replies
from dlqapp.observability import metrics
from dlqapp.observability.logs import log_event
from dlqapp.processing.crashguard import PoisonMessage
from dlqapp.processing.feed import GatedFeed
from dlqapp.processing.flow import InFlightWindow
from dlqapp.tables.topology import TierTopic
from dlqapp.wiring.components import Components
from dlqapp.wiring.faust_app import DlqApp, fail_transactions
from dlqapp.wiring.restart import after_grace

log = logging.getLogger("dlqapp.wiring.agents")

DUE_WINDOW = 4096
"""Due retries the due agent holds at once. Most of them only wait for their due time (the
timer hands them over up to DLQ_DUE_LEAD_MAX early), which costs no backend slot; with the
input window's size a burst of retries due together filled it, and the rest waited in the
agent's queue past their due time."""
HELD_REQUEST_BYTES = 3 * 1024
"""What a worker keeps of a fresh request it read ahead, besides its payload (the consumed
message, its `Record`, the parsed request, its place in the fair queue): 3.4 KiB in all measured
for 20,000 requests of 177 bytes (the bench's), counted against DLQ_READ_AHEAD_BYTES."""
AHEAD_WHILE_WAITING = 64
"""A record the tail read got starts ahead of its turn only while fewer requests of its tenant
wait than this: a tenant that floods waits its turn, one with little waiting does not."""
FATAL_EXIT_CODE = 70
FATAL_GRACE_S = 15.0


@dataclass(frozen=True)
class Agents:
    """The registered agents the rest of the worker talks to."""

    operator: AgentT


class WorkerLifecycle:
    """Start-up and hand-back of a worker (DlqApp calls it; see dlqapp.wiring.faust_app)."""

    def __init__(self, components: Components) -> None:
        self.components = components

    def started(self) -> None:
        self.components.crash_guard.open()

    async def release(self, reopen: bool) -> None:
        """Hand back what the windows hold: a rebalance (`reopen`: they take events again at
        the next assignment) or a shutdown."""
        if self.components.tail_read is not None:
            self.components.tail_read.revoked()
        try:
            released = await self.components.windows.release()
            if not self.components.steps.exactly_once:  # exactly_once: sealed into the last commit
                await self._write_counts()
        finally:
            self.components.offsets.reset()  # the next assignment starts from committed offsets
        if not reopen:
            self.components.crash_guard.close()
            self.components.recorder.log.flush()
        if released:
            reason = "rebalance" if reopen else "shutdown"
            log_event(log, logging.INFO, "in_flight_released", events=released, reason=reason)

    def revoked(self) -> None:
        """The partitions are handed back and their last transactions sealed: the counts of
        this assignment are kept aside (`Counters.on_revoked`). Not before the seal: under
        exactly_once the last transaction carries the counts of the steps that ended in it,
        and counts set aside before it committed them were lost (history seed 6012: a result
        on the topic that `succeeded` never counted)."""
        self.components.counters.on_revoked()

    def assigned(self) -> None:
        """A new assignment begins: the windows closed by a rebalance's release take events again."""
        self.components.windows.reopen()
        if self.components.tail_read is not None:
            self.components.tail_read.assigned()

    def halt(self) -> None:
        """The worker failed and is about to restart or stop: no new step (no new model call)."""
        self.components.windows.halt()

    async def _write_counts(self) -> None:
        try:
            await self.components.steps.write_unwritten_counts()
        except Exception as exc:  # the broker is gone: the counts of the last moment are lost, as in a crash
            log_event(log, logging.WARNING, "counts_not_written", error=repr(exc))


def register_agents(app: DlqApp, components: Components, replies: Replies) -> Agents:
    """Register every agent on `app`, made of the worker's `components`; `replies` sends `ask()` answers."""
    app.attach(WorkerLifecycle(components), components.steps)
    handlers = _Handlers(app, components, replies)
    topology = components.topology
    app.agent(topology.input, name="input")(handlers.input_agent())
    app.agent(topology.due, name="due")(handlers.due_agent())
    for tier_topic in topology.tiers:
        app.agent(tier_topic.topic, name=f"tier-{tier_topic.tier.index + 1}")(handlers.tier_agent(tier_topic))
    app.agent(topology.dlq, name="dlq")(handlers.dlq_agent())
    operator = app.agent(topology.commands, name="operator")(handlers.operator_agent())
    handlers.operator = operator
    return Agents(operator=operator)


def manual_acks(stream: StreamT) -> StreamT:
    """`stream.noack()`: the agent acks each event itself. Faust hands agents its `Stream`,
    whose `noack` the `StreamT` interface does not declare."""
    return cast(Stream, stream).noack()


class _Handlers:
    """The agent bodies, and what happens when a step fails."""

    def __init__(self, app: DlqApp, components: Components, replies: Replies) -> None:
        self.app = app
        self.components = components
        self.replies = replies
        self.operator: AgentT | None = None
        """The operator agent, which answers `ask()` (registered after its body is built)."""

    def stop(self, exc: BaseException) -> None:
        """The worker cannot go on: stop it without acking, so the event is redelivered.

        Under exactly_once the worker restarts in place and rebuilds its tables (its
        transaction's writes never became visible: dlqapp.wiring.restart). Otherwise Faust's
        crash path stops the services; should the process linger, it is ended after a grace
        period (like kill -9, which at-least-once delivery already covers)."""
        if self.components.steps.exactly_once:
            fail_transactions(self.app, exc)
            return
        log.critical("fatal error, stopping the worker: %r", exc)
        self.app.fail(exc)
        after_grace(FATAL_GRACE_S, lambda: os._exit(FATAL_EXIT_CODE))

    def _stop_if_failed(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:
            self.stop(exc)

    async def poison(self, ticket: Ticket, exc: BaseException) -> None:
        """A step failed on this record: dead-letter it as `poison` (in a step of its own)."""
        record = self.record(ticket.event)  # the failure path: the handler's record went with it
        where = record.position
        if isinstance(exc, PoisonMessage) and self.components.pipeline.dedup.already_succeeded(record):
            # In progress at every crash only because it is first in line after each restart
            # (its result was written, its offset not yet committed): nothing to dead-letter.
            log_event(
                log,
                logging.INFO,
                "poison_skipped",
                topic=where[0],
                partition=where[1],
                offset=where[2],
                reason="its request already succeeded",
            )
            return
        log.error(
            "handler failed on %s[%s]@%s; dead-lettering it as poison",
            *where,
            exc_info=None if isinstance(exc, PoisonMessage) else exc,
        )
        await self.components.dead_letters.write_unprocessable(
            record, ErrorClass.POISON, f"handler failed: {type(exc).__name__}: {exc}"[:1000]
        )

    def record(self, event: EventT | TailEvent) -> Record:
        """The door: `event` read once into a `Record` (dlqapp.kafka.records)."""
        return record_of(event, self.components.clock)

    def admit(self, event: EventT) -> Ticket | None:
        """The door of every agent: note the offset, track the event for its ack (None: its
        outputs are committed already; it is acked without being handled)."""
        message = event.message
        self.components.offsets.seen(message.topic, message.partition, message.offset)
        return self.components.windows.admit(event)

    def window(self, limit: int | None = None, on_done: Any = None, on_poison: Any = None) -> InFlightWindow:
        return self.components.windows.new(on_poison or self.poison, self.stop, limit=limit, on_done=on_done)

    async def each_event(
        self, stream: StreamT, window: InFlightWindow, handle: Callable[[Record], Awaitable[object]]
    ) -> None:
        """Every event of `stream` through the door into `window`."""
        async for event in manual_acks(stream).events():
            ticket = self.admit(event)
            if ticket is not None:
                record = self.record(event)
                await window.submit(ticket, functools.partial(handle, record))

    def input_agent(self) -> Callable[[StreamT], Awaitable[None]]:
        pipeline, topic, gate = self.components.pipeline, self.components.topology.input, self.components.input_gate

        async def input_requests(stream: StreamT) -> None:
            """Fresh requests: many in flight at once, acked in offset order; none started
            while due retries are on their way (dlqapp.flowcontrol.input_gate)."""
            window = self.window()
            settings = self.components.settings
            feed = self.components.windows.feed(
                window,
                gate,
                closed_limit=self.app.conf.stream_buffer_maxsize + 4 * self.app.conf.broker_max_poll_records,
                read_ahead=settings.read_ahead,
                read_ahead_bytes=settings.read_ahead_bytes,
                weight_of=lambda tenant: settings.tenant_weights.get(tenant, 1.0),
            )
            gate.pause_fetching_when(feed.backlogged)
            pump = asyncio.create_task(feed.run())
            pump.add_done_callback(self._stop_if_failed)
            tail_read = self.components.tail_read
            if tail_read is not None:
                ahead = asyncio.create_task(tail_read.run(functools.partial(self.run_ahead, feed)))
                ahead.add_done_callback(self._stop_if_failed)
            try:
                async for event in manual_acks(stream).events():
                    ticket = self.admit(event)
                    if ticket is not None:
                        record = self.record(event)
                        admitted = pipeline.admit(record)  # read once: its tenant and tokens for its turn
                        handler = functools.partial(pipeline.on_input, record, topic, admitted)
                        size = HELD_REQUEST_BYTES + len(record.payload or b"")
                        await feed.put(ticket, handler, admitted.tenant, admitted.cost, size)
            finally:
                pump.cancel()
                if tail_read is not None:
                    ahead.cancel()

        return input_requests

    async def run_ahead(self, feed: GatedFeed, consumed: Any) -> None:
        """A record the tail read got (dlqapp.kafka.tail_read): started ahead of its turn when
        it is a valid request owned here whose tenant has fewer than AHEAD_WHILE_WAITING requests
        waiting; any other record is left to the door."""
        waiting = feed.waiting_by_tenant()
        default = self.components.spending.default_tenant
        if waiting.get(default, 0) >= AHEAD_WHILE_WAITING and not may_name_a_tenant(
            consumed.value, (name for name, _ in consumed.headers or ())
        ):
            return  # the default tenant's, which has plenty waiting: not worth reading (a flood's tail)
        event = TailEvent(consumed)
        record = self.record(event)
        pipeline = self.components.pipeline
        admitted = pipeline.admit(record)
        request = admitted.request
        if request is None or not self.components.store.owns(record, request.request_id):
            return
        if waiting.get(admitted.tenant, 0) >= AHEAD_WHILE_WAITING:
            return
        ticket = self.components.windows.admit_ahead(event, record.topic, record.partition, record.offset)
        if ticket is None:
            return
        handler = functools.partial(pipeline.on_input, record, self.components.topology.input, admitted)
        size = HELD_REQUEST_BYTES + len(record.payload or b"")
        metrics.started_ahead.labels(self.components.spending.tenant_label(admitted.tenant)).inc()
        await feed.put(ticket, handler, admitted.tenant, admitted.cost, size, back_pressure=False)

    def due_agent(self) -> Callable[[StreamT], Awaitable[None]]:
        scheduler = self.components.scheduler

        async def due(stream: StreamT) -> None:
            """Due retries handed over by the timer: attempted ahead of fresh input."""
            await self.each_event(stream, self.window(DUE_WINDOW), scheduler.on_due)

        return due

    def tier_agent(self, tier_topic: TierTopic) -> Callable[[StreamT], Awaitable[None]]:
        scheduler = self.components.scheduler

        async def park(stream: StreamT) -> None:
            await self.each_event(
                stream, self.window(), lambda record: scheduler.park(record, tier_topic.tier, tier_topic.topic)
            )

        park.__doc__ = f"Parks retries of tier {tier_topic.tier.label} until their due time."
        return park

    def dlq_agent(self) -> Callable[[StreamT], Awaitable[None]]:
        recorder = self.components.recorder

        async def dlq(stream: StreamT) -> None:
            """Dead letters, one at a time: the DLQ table, the JSON-lines log, the alert line."""
            await self.each_event(stream, self.window(limit=1), recorder.on_message)

        return dlq

    def operator_agent(self) -> Callable[[StreamT], Awaitable[None]]:
        operator, dead_letters = self.components.operator, self.components.dead_letters

        async def answer(ticket: Ticket, reply: object) -> None:
            if reply is not None and self.operator is not None:
                await self.replies.answer(self.operator, ticket.event, reply)

        async def failed(ticket: Ticket, exc: BaseException) -> dict[str, Any]:
            """A command whose step failed: dead-lettered as poison, and the asker told."""
            await self.poison(ticket, exc)
            command = asked_value(ticket.event)
            request_id = command.get("request_id") if isinstance(command, dict) else None
            return {"request_id": request_id, "status": "error", "reason": f"{type(exc).__name__}: {exc}"[:500]}

        async def operator_commands(stream: StreamT) -> None:
            """Operator commands, one at a time, on the owning worker; answers `ask()` once committed."""
            window = self.window(limit=1, on_done=answer, on_poison=failed)
            async for event in manual_acks(stream).events():
                ticket = self.admit(event)
                if ticket is None:
                    continue

                async def handle(event: EventT = event) -> object:
                    try:
                        return await operator.execute(asked_value(event))
                    except ValueError as exc:  # not a command: dead-letter it (it was not an operator's)
                        await dead_letters.write_unprocessable(
                            self.record(event), ErrorClass.INVALID_REQUEST, f"invalid operator command: {exc}"[:1000]
                        )
                        return {"status": "invalid", "reason": str(exc)}

                await window.submit(ticket, handle)

        return operator_commands
