"""Faust wiring: one agent per topic. Logic lives in the components they call.

- `input` and `due`: many handlers in flight at once (an in-flight window each), acked in
  offset order; a handler that raises dead-letters its message as `poison`.
- one agent per retry tier: parks what lands on the tier topic, many at once (each park
  waits for its changelog write; one at a time, a burst of 300 failures took 2 s to park,
  and retries of the last ones fell due before they were parked).
- `dlq`: records every dead letter; `operator`: replays, discards, expiries, one at a time.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from aiokafka.errors import KafkaError
from faust import EventT, Stream, StreamT
from faust.types import AgentT

from dlqapp.core.errors import ErrorClass
from dlqapp.core.record import Record
from dlqapp.kafka.consumer_state import crash, forget_unacked
from dlqapp.kafka.records import record_of
from dlqapp.kafka.transactions import TransactionFailed
from dlqapp.observability.logs import log_event
from dlqapp.processing.crashguard import PoisonMessage
from dlqapp.tables.durability import after_commit, changelog_barrier, write_to_changelog
from dlqapp.tables.topology import TierTopic
from dlqapp.wiring.faust_app import fail_transactions
from dlqapp.wiring.restart import after_grace

log = logging.getLogger("dlqapp.wiring.agents")

DUE_WINDOW = 4096
"""Due retries the due agent holds at once. Most of them only wait for their due time (the
timer hands them over up to DLQ_DUE_LEAD_MAX early), which costs no backend slot; with the
input window's size (2 x DLQ_CONCURRENCY) a burst of retries due together filled it, and
the rest waited in the agent's queue past their due time."""
FATAL_EXIT_CODE = 70
FATAL_GRACE_S = 15.0


@dataclass(frozen=True)
class Agents:
    """The registered agents the rest of the worker talks to."""

    operator: AgentT


class WorkerLifecycle:
    """Start-up and hand-back of a worker (DlqApp calls it; see dlqapp.wiring.faust_app)."""

    def __init__(self, parts: Any) -> None:
        self.parts = parts

    def started(self) -> None:
        self.parts.crash_guard.open()

    async def release(self, reopen: bool) -> None:
        """Hand back what the windows hold: a rebalance (`reopen`: they take events again at
        the next assignment) or a shutdown."""
        try:
            released = await self.parts.windows.release()
            await self._write_counts()
        finally:
            self.parts.offsets.reset()  # the next assignment starts from committed offsets
        if reopen:
            self.parts.counters.on_revoked()
        else:
            self.parts.crash_guard.close()
        if released:
            log_event(
                log, logging.INFO, "in_flight_released", events=released, reason="rebalance" if reopen else "shutdown"
            )

    def assigned(self) -> None:
        """A new assignment begins: the windows closed by a rebalance's release take events again."""
        self.parts.windows.reopen()

    async def _write_counts(self) -> None:
        stats = self.parts.topology.stats
        try:
            await self.parts.counters.write_unwritten(
                lambda key, blob, partition: write_to_changelog(stats, key, blob, partition)
            )
        except Exception as exc:  # the broker is gone: the counts of the last moment are lost, as in a crash
            log_event(log, logging.WARNING, "counts_not_written", error=repr(exc))


def register_agents(app: Any, parts: Any) -> Agents:
    """Register every agent on `app`; `parts` are the worker's components."""
    app.attach(WorkerLifecycle(parts), parts)
    handlers = _Handlers(app, parts)
    topology = parts.topology
    app.agent(topology.input, name="input")(handlers.input_agent())
    app.agent(topology.due, name="due")(handlers.due_agent())
    for tier_topic in topology.tiers:
        app.agent(tier_topic.topic, name=f"tier-{tier_topic.tier.index + 1}")(handlers.tier_agent(tier_topic))
    app.agent(topology.dlq, name="dlq")(handlers.dlq_agent())
    operator = app.agent(topology.commands, name="operator")(handlers.operator_agent())
    return Agents(operator=operator)


def manual_acks(stream: StreamT) -> StreamT:
    """`stream.noack()`: the agent acks each event itself. Faust hands agents its `Stream`,
    whose `noack` the `StreamT` interface does not declare."""
    return cast(Stream, stream).noack()


class _Handlers:
    """The agent bodies, and what they do when a handler fails."""

    def __init__(self, app: Any, parts: Any) -> None:
        self.app = app
        self.parts = parts

    def fatal(self, exc: BaseException) -> None:
        """The broker failed us: stop the worker without acking, so the event is redelivered.

        Faust's crash path stops the services; should the process linger, it is ended
        after a grace period (like kill -9, which at-least-once delivery already covers).
        """
        if isinstance(exc, TransactionFailed) or self.parts.transactions is not None:
            # exactly_once (e.g. ProducerFenced on a send): the tables hold writes that will
            # never commit, so rebuild them and rejoin (dlqapp.wiring.restart)
            fail_transactions(self.app, exc)
            return
        log.critical("fatal error, stopping the worker: %r", exc)
        crash(self.app, exc)
        after_grace(FATAL_GRACE_S, lambda: os._exit(FATAL_EXIT_CODE))

    async def poison(self, event: EventT, exc: BaseException) -> None:
        """A handler failed on this message: dead-letter it as `poison` and move on.

        Kafka errors are not the message's fault: they stop the worker (not acked).
        """
        if isinstance(exc, (KafkaError, TransactionFailed)):
            raise exc
        record = self.record(event)  # the failure path: the handler's record went with it
        where = record.position
        if isinstance(exc, PoisonMessage) and self.parts.pipeline.already_succeeded(record):
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
        await self.parts.dead_letters.write_unprocessable(
            record, ErrorClass.POISON, f"handler failed: {type(exc).__name__}: {exc}"[:1000]
        )

    def record(self, event: EventT) -> Record:
        """The door: `event` read once into a `Record` (dlqapp.kafka.records)."""
        return record_of(event, self.parts.clock)

    def watch(self, event: EventT) -> None:
        """Notice a hole in the offsets handed to this agent (dlqapp.kafka.offset_watch)."""
        message = event.message
        self.parts.offsets.seen(message.topic, message.partition, message.offset)

    def window(self, limit: int | None = None) -> Any:
        return self.parts.windows.new(
            self.poison, self.fatal, lambda event: forget_unacked(self.app, event), self.parts.crash_guard, limit
        )

    async def each_event(self, stream: StreamT, handle: Callable[[EventT], Awaitable[None]]) -> None:
        """Handle events one at a time; a failing one is dead-lettered as poison, never fatal.

        Each event is acked once its outputs are committed: at once under at-least-once,
        at its partition's next commit under exactly-once (the next event need not wait
        for it; acks stay in offset order, a partition's commits being in order)."""
        async for event in manual_acks(stream).events():
            self.watch(event)
            try:
                barrier = changelog_barrier(wait_for_commit=False)
                async with barrier:
                    await handle(event)
            except Exception as exc:
                try:
                    barrier = changelog_barrier(wait_for_commit=False)
                    async with barrier:
                        await self.poison(event, exc)
                except Exception as fatal:
                    self.fatal(fatal)
                    raise
            after_commit(barrier.committed, event.ack)  # never when it fails: the worker restarts

    def input_agent(self) -> Callable[[StreamT], Awaitable[None]]:
        pipeline, topic, gate = self.parts.pipeline, self.parts.topology.input, self.parts.input_gate

        async def input_requests(stream: StreamT) -> None:
            """Fresh requests: many in flight at once, acked in offset order; none started
            while due retries are on their way (dlqapp.flowcontrol.input_gate)."""
            window = self.window()
            feed = self.parts.windows.feed(
                window,
                gate,
                closed_limit=self.app.conf.stream_buffer_maxsize + 4 * self.app.conf.broker_max_poll_records,
            )
            gate.pause_fetching_when(feed.backlogged)
            pump = asyncio.create_task(feed.run())

            def stop_if_failed(task: asyncio.Task[None]) -> None:
                if not task.cancelled() and (exc := task.exception()) is not None:
                    self.fatal(exc)

            pump.add_done_callback(stop_if_failed)
            try:
                async for event in manual_acks(stream).events():
                    self.watch(event)
                    record = self.record(event)
                    await feed.put(record.partition, event, lambda record=record: pipeline.on_input(record, topic))
            finally:
                pump.cancel()

        return input_requests

    def due_agent(self) -> Callable[[StreamT], Awaitable[None]]:
        scheduler = self.parts.scheduler

        async def due(stream: StreamT) -> None:
            """Due retries handed over by the timer: attempted ahead of fresh input."""
            window = self.window(DUE_WINDOW)
            async for event in manual_acks(stream).events():
                self.watch(event)
                record = self.record(event)
                await window.submit(record.partition, event, lambda record=record: scheduler.on_due(record))

        return due

    def tier_agent(self, tier_topic: TierTopic) -> Callable[[StreamT], Awaitable[None]]:
        scheduler = self.parts.scheduler

        async def park(stream: StreamT) -> None:
            window = self.window()
            async for event in manual_acks(stream).events():
                self.watch(event)
                record = self.record(event)
                await window.submit(
                    record.partition,
                    event,
                    lambda record=record: scheduler.park(record, tier_topic.tier, tier_topic.topic),
                )

        park.__doc__ = f"Parks retries of tier {tier_topic.tier.label} until their due time."
        return park

    def dlq_agent(self) -> Callable[[StreamT], Awaitable[None]]:
        recorder = self.parts.recorder

        async def dlq(stream: StreamT) -> None:
            """Dead letters: the DLQ table, the JSON-lines log, the alert line."""
            await self.each_event(stream, lambda event: recorder.on_message(self.record(event)))

        return dlq

    def operator_agent(self) -> Callable[[StreamT], AsyncIterator[dict[str, Any]]]:
        operator, dead_letters = self.parts.operator, self.parts.dead_letters

        async def operator_commands(stream: StreamT) -> AsyncIterator[dict[str, Any]]:
            """Operator commands, one at a time, on the owning worker; answers `ask()`."""
            async for command in stream:
                try:
                    async with changelog_barrier():
                        answer = await operator.execute(command)
                    yield answer
                except ValueError as exc:  # not a command: dead-letter it (it was not an operator's)
                    event = stream.current_event
                    if event is not None:
                        # a stream step of its own: its send joins the partition's transaction
                        async with changelog_barrier():
                            await dead_letters.write_unprocessable(
                                self.record(event),
                                ErrorClass.INVALID_REQUEST,
                                f"invalid operator command: {exc}"[:1000],
                            )
                    yield {"status": "invalid", "reason": str(exc)}
                except Exception as exc:  # answer the asker instead of leaving it to time out
                    log.exception("operator command failed: %r", command)
                    request_id = command.get("request_id") if isinstance(command, dict) else None
                    yield {"request_id": request_id, "status": "error", "reason": f"{type(exc).__name__}: {exc}"}

        return operator_commands
