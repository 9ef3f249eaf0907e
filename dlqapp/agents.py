"""Faust wiring: one agent per topic, and the retry timer. Logic lives elsewhere."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Awaitable, Callable

from aiokafka.errors import KafkaError
from faust import EventT, StreamT, TopicT

from dlqapp.app import app, settings
from faust.sensors.prometheus import setup_prometheus_sensors

from dlqapp import metrics
from dlqapp.alerts import AlertBatcher
from dlqapp.classification import ErrorClass
from dlqapp.crashguard import CrashGuard, PoisonMessage
from dlqapp.counters import Counters
from dlqapp.durability import at_end_of_step, changelog_barrier
from dlqapp.faust_compat import active_partitions, forget_unacked, read_partition
from dlqapp.logs import log_event
from dlqapp.dlq import DeadLetterRecorder
from dlqapp.flow import InFlightWindow
from dlqapp.inference import create_backend
from dlqapp.pipeline import Pipeline
from dlqapp.retry import DueHop, RetryScheduler
from dlqapp.models import now_ms
from dlqapp.operator import EXPIRE, Command, Operator
from dlqapp.retention import SweptTable, Sweeper, ledger_last_change, request_last_change
from dlqapp.topology import (
    commands_topic,
    dead_letters,
    dlq_topic,
    due_topic,
    input_topic,
    parked_retries,
    replay_ledger,
    requests_table,
    stats_table,
    results_topic,
    tier_topics,
)

log = logging.getLogger("dlqapp.agents")

backend = create_backend(settings)
counters = Counters(stats_table)
at_end_of_step(counters.flush_due)
pipeline = Pipeline(
    settings,
    backend,
    tier_topics=tier_topics,
    dlq_topic=dlq_topic,
    results_topic=results_topic,
    requests_table=requests_table,
    counters=counters,
)
scheduler = RetryScheduler(pipeline, parked_retries, DueHop(settings.kafka_bootstrap, due_topic.get_topic_name()))
pipeline.park = scheduler.store
alerts = AlertBatcher(settings.alert_webhook_url, settings.alert_window_ms, settings.app_id) if settings.alert_webhook_url else None
recorder = DeadLetterRecorder(
    dead_letters, counters, settings.dead_letter_log, alerts, settings.max_payload_bytes, settings.dlq_log_max_bytes, settings.dlq_log_backups
)
operator = Operator(pipeline, recorder, replay_ledger, input_topic, dlq_topic)


FATAL_EXIT_CODE = 70
FATAL_GRACE_S = 15.0
windows: list[InFlightWindow] = []
"""Every in-flight window, so shutdown and rebalances can hand their events back."""


def _fatal(exc: BaseException) -> None:
    """The broker failed us: stop the worker without acking, so the event is redelivered.

    Faust's crash path stops the services; should the process linger, it is ended
    after a grace period (like kill -9, which at-least-once delivery already covers).
    """
    log.critical("fatal error, stopping the worker: %r", exc)
    app._crash(exc)
    asyncio.get_running_loop().call_later(FATAL_GRACE_S, os._exit, FATAL_EXIT_CODE)


async def _poison(event: EventT, exc: BaseException) -> None:
    """A handler failed on this message: dead-letter it as `poison` and move on.

    Kafka errors are not the message's fault: they stop the worker (not acked).
    """
    if isinstance(exc, KafkaError):
        raise exc
    where = (event.message.topic, event.message.partition, event.message.offset)
    log.error("handler failed on %s[%s]@%s; dead-lettering it as poison", *where, exc_info=None if isinstance(exc, PoisonMessage) else exc)
    await pipeline.dead_letter_unprocessable(event, ErrorClass.POISON, f"handler failed: {type(exc).__name__}: {exc}"[:1000])


crash_guard = CrashGuard(os.path.join(settings.data_dir, "in-progress.json"), settings.poison_after_crashes)


def _window() -> InFlightWindow:
    window = InFlightWindow(
        settings.concurrency * 2, on_error=_poison, on_fatal=_fatal, forget=lambda event: forget_unacked(app, event), guard=crash_guard
    )
    windows.append(window)
    return window


async def release_in_flight(reopen: bool) -> None:
    """Hand back what the windows hold (shutdown, rebalance): see InFlightWindow.release."""
    released = 0
    for window in windows:
        released += await window.release(settings.drain_timeout_ms / 1000, reopen=reopen)
    if reopen:
        counters.on_revoked()
    else:
        crash_guard.close()
    if released:
        log_event(log, logging.INFO, "in_flight_released", events=released, reason="rebalance" if reopen else "shutdown")


app.release_in_flight = release_in_flight


async def _each_event(stream: StreamT, handle: Callable[[EventT], Awaitable[None]]) -> None:
    """Handle events one at a time; a failing one is dead-lettered as poison, never fatal."""
    async for event in stream.events():
        try:
            async with changelog_barrier():
                await handle(event)
        except Exception as exc:
            try:
                async with changelog_barrier():
                    await _poison(event, exc)
            except Exception as fatal:
                _fatal(fatal)
                raise


@app.agent(input_topic, name="input")
async def input_agent(stream: StreamT) -> None:
    """Fresh requests: many in flight at once, acked in offset order."""
    window = _window()
    async for event in stream.noack().events():
        await window.submit(event.message.partition, event, lambda event=event: pipeline.on_input(event, input_topic))


@app.agent(due_topic, name="due")
async def due_agent(stream: StreamT) -> None:
    """Due retries handed over by the timer: attempted ahead of fresh input."""
    window = _window()
    async for event in stream.noack().events():
        await window.submit(event.message.partition, event, lambda event=event: scheduler.on_due(event))


def _tier_agent(tier: int, topic: TopicT) -> None:
    async def park(stream: StreamT) -> None:
        await _each_event(stream, lambda event: scheduler.park(event, tier, topic))

    park.__doc__ = f"Parks retries of tier {topic.get_topic_name()} until their due time."
    app.agent(topic, name=f"tier-{tier + 1}")(park)


for _tier, _topic in enumerate(tier_topics):
    _tier_agent(_tier, _topic)


@app.agent(dlq_topic, name="dlq")
async def dlq_agent(stream: StreamT) -> None:
    """Dead letters: the DLQ table, the JSON-lines log, the alert line."""
    await _each_event(stream, recorder.on_message)


@app.agent(commands_topic, name="operator")
async def operator_agent(stream: StreamT):
    """Operator commands (replay, discard), one at a time, on the owning worker; answers `ask()`."""
    async for command in stream:
        try:
            async with changelog_barrier():
                answer = await operator.execute(command)
            yield answer
        except ValueError as exc:  # not a command: dead-letter it (it was not an operator's)
            event = stream.current_event
            if event is not None:
                await pipeline.dead_letter_unprocessable(event, ErrorClass.INVALID_REQUEST, f"invalid operator command: {exc}"[:1000])
            yield {"status": "invalid", "reason": str(exc)}
        except Exception as exc:  # answer the asker instead of leaving it to time out
            log.exception("operator command failed: %r", command)
            yield {"request_id": command.get("request_id") if isinstance(command, dict) else None, "status": "error", "reason": f"{type(exc).__name__}: {exc}"}


@app.task
async def retry_timer() -> None:
    """Every DLQ_TIMER_INTERVAL, hand due retries to the due agent."""
    interval = settings.timer_interval_ms / 1000
    await scheduler.due_hop.start()
    try:
        while not app.should_stop:
            await asyncio.sleep(interval)
            if app.rebalancing or app.in_recovery:
                scheduler.forget_fired()
                continue
            try:
                await scheduler.fire_due()
                await scheduler.recount_if_reassigned()
            except Exception:  # a failed tick must not stop the timer; the next one retries
                log.exception("retry timer tick failed")
    finally:
        await scheduler.due_hop.stop()


SWEEP_INTERVAL_S = 1.0


async def _send_expired(table: str, partition: int, expired: list[tuple[str, int]]) -> None:
    command = Command(EXPIRE, expired[0][0], "retention", table=table, expired=[list(pair) for pair in expired])
    await commands_topic.send(key=expired[0][0].encode(), value=command.to_dict(), partition=partition)


sweeper = Sweeper(
    [
        SweptTable(requests_table, request_last_change),
        SweptTable(replay_ledger, ledger_last_change, keep=lambda key: dead_letters.get(key) is not None),
    ],
    settings.state_retention_ms,
    _send_expired,
)


@app.task
async def retention_sweep() -> None:
    """Forget settled states and old ledgers after DLQ_STATE_RETENTION (dlqapp.retention)."""
    while not app.should_stop:
        await asyncio.sleep(SWEEP_INTERVAL_S)
        if app.rebalancing or app.in_recovery:
            sweeper.forget_cursors()
            continue
        try:
            await sweeper.sweep(now_ms())
        except Exception:  # the next tick tries again
            log.exception("retention sweep failed")


@app.task
async def crash_journal() -> None:
    """Keep the crash-loop guard's journal about a second behind (see dlqapp.crashguard)."""
    crash_guard.open()
    while not app.should_stop:
        await asyncio.sleep(1.0)
        crash_guard.snapshot()


@app.task
async def alert_webhook() -> None:
    """Post batched dead-letter alerts when DLQ_ALERT_WEBHOOK_URL is set."""
    if alerts is not None:
        await alerts.run(lambda: app.should_stop)


def _consumer_lag() -> list[tuple[str, int, int]]:
    """(topic, partition, log end offset minus committed offset) for dlqapp's topics."""
    consumer = app.consumer
    ours = set(settings.all_topics())
    lag = []
    try:
        assigned = consumer.assignment()
    except Exception:  # the consumer has not started yet
        return lag
    for tp in assigned:
        if tp.topic not in ours:
            continue
        try:
            high = consumer.highwater(tp)
        except Exception:  # not fetched yet
            continue
        if high is not None:
            lag.append((tp.topic, tp.partition, max(0, high - (consumer._committed_offset.get(tp) or 0))))
    return lag


setup_prometheus_sensors(app, name_prefix="faust")
metrics.register_state_collector(
    metrics.StateCollector(
        dlq_entries=lambda: max(0, counters.total(active_partitions(stats_table), lambda p, k: read_partition(stats_table, p, k))["dlq_size"]),
        parked_by_tier=scheduler.parked_by_tier_name,
        consumer_lag=_consumer_lag,
        breaker_state=lambda: pipeline.breaker.state,
        breaker_moves=lambda: dict(pipeline.breaker.moves),
    )
)
