"""The composition root: the one place that builds dlqapp from its settings.

`build_app()` creates the Faust app, declares its topics and tables, builds every
component with its collaborators passed in (nothing optional, nothing set afterwards),
registers the agents, services, web views and CLI commands, and returns the app.
Importing any dlqapp module builds nothing; `faust -A dlqapp` calls this once.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from typing import Any

from dlqapp.core.backoff import Backoff
from dlqapp.core.breaker import CLOSED, CircuitBreaker
from dlqapp.core.budgets import is_stale_spend
from dlqapp.core.in_flight import InFlight
from dlqapp.core.outcomes import RetryPolicy
from dlqapp.deadletters.alerts import AlertBatcher
from dlqapp.deadletters.log_file import DeadLetterLog
from dlqapp.deadletters.operator import Operator
from dlqapp.deadletters.recorder import DeadLetterRecorder, OldestDeadLetter
from dlqapp.deadletters.replay_jobs import ReplayJobs
from dlqapp.deadletters.writer import DeadLetterWriter
from dlqapp.flowcontrol.aimd import AimdLimit
from dlqapp.flowcontrol.gate import RateGate, metric_label
from dlqapp.flowcontrol.input_gate import InputGate
from dlqapp.flowcontrol.slots import SlotLimiter
from dlqapp.kafka.acks import Acks
from dlqapp.kafka.faust_tables import active_partitions, keys_with_prefix, partition_db
from dlqapp.kafka.offset_watch import OffsetWatch
from dlqapp.kafka.tail_read import TailRead
from dlqapp.kafka.transactions import Transactions
from dlqapp.observability import metrics
from dlqapp.observability.health import MinuteRates
from dlqapp.observability.lateness import LatenessWindow
from dlqapp.observability.logs import log_breaker_move
from dlqapp.observability.metrics import BoundedLabel
from dlqapp.observability.tracing import Tracing
from dlqapp.processing.caller import BackendCaller
from dlqapp.processing.crashguard import CrashGuard
from dlqapp.processing.dedup import Dedup
from dlqapp.processing.pipeline import Pipeline
from dlqapp.processing.results import ResultPublisher
from dlqapp.processing.spend import Spending
from dlqapp.processing.windows import InFlightWindows
from dlqapp.retries.actions import RetryActions
from dlqapp.retries.lead import DueLead
from dlqapp.retries.parked import ParkedRetries
from dlqapp.retries.scheduler import RetryScheduler
from dlqapp.retries.tier_parking import RetryParking
from dlqapp.settings import Settings
from dlqapp.tables.counters import Counters
from dlqapp.tables.progress import STRIKE_PREFIX, Progress
from dlqapp.tables.request_store import RequestStore
from dlqapp.tables.retention import (
    Sweeper,
    SweptTable,
    ledger_last_change,
    request_last_change,
)
from dlqapp.tables.spend_view import SpendView
from dlqapp.tables.steps import StreamSteps
from dlqapp.tables.topology import Topology, declare, register_codecs
from dlqapp.wiring.components import Components, Ports
from dlqapp.wiring.faust_app import DlqApp, create_app
from dlqapp.wiring.ports import ports_of
from dlqapp.wiring.process import install_event_loop, load_settings, report_fatal_errors
from dlqapp.wiring.registration import register_metrics, register_services


def build_components(settings: Settings, topology: Topology, ports: Ports) -> Components:
    """Every component of a worker, wired from the settings."""
    clock, backend = ports.clock, ports.backend
    rates = MinuteRates()
    counters = Counters(
        topology.stats,
        topology.steps,
        observe=lambda name, amount: rates.add(name, amount, clock()),
        forget=lambda name: is_stale_spend(name, clock()),
    )
    spend_view = SpendView(
        counters.value, ports.owned_partitions or (lambda: active_partitions(topology.stats)), counters.spend
    )
    spending = Spending(
        settings.prices,
        settings.budgets,
        view=spend_view,
        counters=counters,
        default_model=settings.default_model,
        default_tenant=settings.default_tenant,
        clock=clock,
        share=ports.input_share,
        tenant_label=BoundedLabel(
            settings.metrics_tenants,
            named=lambda t: (
                t in settings.budgets.entries or t in settings.tenant_weights or spend_view.has_set_budget(t)
            ),
        ),
        model_label=BoundedLabel(settings.metrics_models, named=settings.named_models().__contains__),
    )
    acks = Acks(ports.hand_back)
    transactions = (
        Transactions(settings.app_id, ports.new_producer, settings.transaction_timeout_ms / 1000)
        if ports.new_producer
        else None
    )
    progress = progress_of(topology, acks) if transactions is not None else None
    steps = StreamSteps(
        topology.steps,
        transactions=transactions,
        send=ports.send,
        counters=counters,
        seal_tables=progress.seal if progress is not None else lambda partition: [],
        strikes=progress.strike_records if progress is not None else lambda partition, culprits: [],
    )
    store = RequestStore(settings.partitions, topology.requests, counters=counters, clock=clock, send=steps.send)
    parked = ParkedRetries(topology.parked_retries, settings.tiers)
    policy = RetryPolicy(
        backoff=Backoff(settings.retry_delays_ms, settings.backoff, settings.backoff_jitter),
        retryable=settings.retryable,
        max_age_ms=settings.max_age_ms,
        fallback_model=settings.fallback_model,
    )
    in_flight = InFlight()
    tracing = tracing_of(settings, ports.span_exporters)
    caller = BackendCaller(
        backend,
        CircuitBreaker(settings.breaker_config(), on_move=log_breaker_move),
        slot_limiter(settings),
        timeout_ms=settings.inference_timeout_ms,
        clock=clock,
        lateness=LatenessWindow(),
        gate=rate_gate(settings, ports.input_share),
        steps=topology.steps,
    )
    dead_letters = DeadLetterWriter(store, topology.dlq, in_flight=in_flight, clock=clock)
    pipeline = Pipeline(
        caller,
        policy,
        store=store,
        parking=RetryParking(store, parked, tiers=tuple((t.tier, t.topic) for t in topology.tiers), clock=clock),
        dead_letters=dead_letters,
        results=ResultPublisher(store, topology.results, clock),
        in_flight=in_flight,
        max_payload_bytes=settings.max_payload_bytes,
        max_message_bytes=settings.max_message_bytes,
        clock=clock,
        after_sent=steps.after_sent,
        spending=spending,
        budget_recheck_ms=settings.budget_recheck_ms,
        dedup=Dedup(store, in_flight, clock, redelivery_by_time=not settings.exactly_once),
        rng=random.Random(),
        tracing=tracing,
    )
    input_gate = InputGate(lambda: caller.breaker.state == CLOSED, clock)
    scheduler = RetryScheduler(
        parked,
        pipeline.attempt,
        dead_letters=dead_letters,
        in_flight=in_flight,
        store=store,
        handover=ports.handover,
        gate=input_gate,
        batch=settings.timer_batch,
        max_payload_bytes=settings.max_payload_bytes,
        clock=clock,
        lead=DueLead(settings.due_lead_max_ms),
    )
    alerts = (
        AlertBatcher(settings.alert_webhook_url, settings.alert_window_ms, settings.app_id)
        if settings.alert_webhook_url
        else None
    )
    oldest_dead_letter = OldestDeadLetter(topology.dead_letters)
    recorder = DeadLetterRecorder(
        topology.dead_letters,
        topology.dead_letters_by_time,
        counters=counters,
        oldest=oldest_dead_letter,
        log=DeadLetterLog(settings.dead_letter_log, settings.dlq_log_max_bytes, settings.dlq_log_backups),
        alerts=alerts,
        max_payload_bytes=settings.max_payload_bytes,
    )
    operator = Operator(
        store,
        recorder,
        ledger=topology.replay_ledger,
        retries=RetryActions(parked, scheduler, dead_letters=dead_letters, in_flight=in_flight, store=store),
        input_topic=topology.input,
        dlq_topic=topology.dlq,
        in_flight=in_flight,
        max_replays=settings.max_replays,
        clock=clock,
        tracing=tracing,
        budgets_table=topology.stats,
    )
    crash_guard = CrashGuard(os.path.join(settings.data_dir, "in-progress.json"), settings.poison_after_crashes)
    windows = InFlightWindows(
        window_limit(settings),
        settings.drain_timeout_ms / 1000,
        steps=steps,
        acks=acks,
        progress=progress,
        guard=crash_guard,
    )
    sweeper = Sweeper(
        [
            SweptTable(topology.requests, request_last_change),
            SweptTable(
                topology.replay_ledger, ledger_last_change, keep=lambda key: topology.dead_letters.get(key) is not None
            ),
        ],
        settings.state_retention_ms,
        expire=operator.send_expired(topology.commands),
    )
    return Components(
        settings=settings,
        steps=steps,
        acks=acks,
        progress=progress,
        topology=topology,
        clock=clock,
        backend=backend,
        counters=counters,
        store=store,
        parked=parked,
        caller=caller,
        dead_letters=dead_letters,
        pipeline=pipeline,
        scheduler=scheduler,
        input_gate=input_gate,
        recorder=recorder,
        operator=operator,
        crash_guard=crash_guard,
        windows=windows,
        sweeper=sweeper,
        alerts=alerts,
        replay_jobs=ReplayJobs(),
        oldest_dead_letter=oldest_dead_letter,
        rates=rates,
        offsets=OffsetWatch(
            lambda topic, skipped: metrics.offset_gaps.labels(topic).inc(),
            level=logging.DEBUG if settings.exactly_once else logging.WARNING,
        ),
        tracing=tracing,
        spending=spending,
        spend_view=spend_view,
        tail_read=tail_read_of(settings, ports, acks),
    )


def tail_read_of(settings: Settings, ports: Ports, acks: Acks) -> TailRead | None:
    """The tail read of `input` (dlqapp.kafka.tail_read), when the ports can make its consumer."""
    if ports.tail_consumer is None or settings.tail_read_lag <= 0:
        return None
    return TailRead(
        ports.tail_consumer,
        topic=settings.input,
        lag=settings.tail_read_lag,
        partitions=ports.input_partitions,
        ends=ports.input_ends,
        expected=lambda partition: acks.expected((settings.input, partition)),
    )


def tracing_of(settings: Settings, exporters: tuple[Any, ...]) -> Tracing:
    """Spans with the OpenTelemetry SDK, exported to `exporters`; tracing off when there are none."""
    if not exporters:
        return Tracing()
    from dlqapp.observability.otel import OtelTracing

    return OtelTracing.create(settings, exporters)


def window_limit(settings: Settings) -> int:
    """Events each agent may handle at once: twice the backend slots (a call's event and the
    next one's). A step's place in the window ends with the step, not at its commit."""
    return settings.concurrency * 2


def progress_of(topology: Topology, acks: Acks) -> Progress:
    """The `progress` table over its local stores, fed by the acks' positions."""
    table = topology.progress
    return Progress(
        table,
        positions=acks.progress,
        read=lambda partition, key: partition_db(table, partition).get(key),
        has_strikes=lambda partition: any(
            True for _ in keys_with_prefix(partition_db(table, partition), STRIKE_PREFIX, 1)
        ),
    )


def slot_limiter(settings: Settings) -> SlotLimiter:
    """Backend slots by priority, under the adaptive limit unless DLQ_ADAPTIVE_CONCURRENCY=false."""
    adaptive = (
        AimdLimit(settings.concurrency_floor, settings.concurrency, time.monotonic)
        if settings.adaptive_concurrency
        else None
    )
    return SlotLimiter(settings.concurrency, adaptive, weights=settings.tenant_weights)


def rate_gate(settings: Settings, share: Callable[[], float]) -> RateGate:
    """Per-model waiting for DLQ_RATE_LIMITS capacity, at this worker's share."""
    limits = settings.rate_limits
    return RateGate(
        limits,
        default_model=settings.default_model,
        share=share,
        on_wait=lambda model, s: metrics.rate_wait.labels(metric_label(limits, model)).observe(s),
    )


def build_app(settings: Settings | None = None) -> DlqApp:
    """The dlqapp Faust app with every agent, service, view and command registered."""
    from dlqapp.api.service import Api
    from dlqapp.api.views import register_views
    from dlqapp.cli import register_commands
    from dlqapp.kafka.replies import Replies, answers_producer
    from dlqapp.wiring.agents import register_agents

    settings = settings or load_settings()
    report_fatal_errors()
    install_event_loop(settings)
    register_codecs()
    app = create_app(settings)
    topology = declare(app, settings)
    components = build_components(settings, topology, ports_of(app, settings, topology))
    replies = Replies(app, answers_producer(settings.kafka_client(client_id="dlqapp-answers")))
    agents = register_agents(app, components, replies)
    register_services(app, components)
    app.add_service(replies)
    register_views(app, Api(app, components, agents.operator))
    register_commands(app)
    register_metrics(app, components)
    return app
