"""What runs beside the agents, registered on the app: the services (timer, input pause,
retention sweep, crash journal, spend follower, alerts, traces, commits) and the metrics
read from the components."""

from __future__ import annotations

from dlqapp.kafka.changelog_follower import ChangelogFollower
from dlqapp.kafka.faust_consumer_state import consumer_lag
from dlqapp.observability import metrics
from dlqapp.observability.faust_monitor import install_counting_monitor
from dlqapp.observability.health import worker_readiness
from dlqapp.wiring.components import Components
from dlqapp.wiring.faust_app import DlqApp, fail_transactions
from dlqapp.wiring.services import (
    AlertWebhook,
    CrashJournal,
    InputPause,
    LoopLag,
    RetentionSweep,
    RetryTimer,
    SpendFollower,
    TracingFlush,
    TransactionCommits,
)


def register_services(app: DlqApp, components: Components) -> None:
    """The services that run beside the agents, each with its components."""
    settings = components.settings
    app.add_service(RetryTimer(app, components.scheduler, settings.timer_interval_ms))
    app.add_service(InputPause(app, components.input_gate, components.topology.input.get_topic_name()))
    app.add_service(RetentionSweep(app, components.sweeper, components.clock))
    app.add_service(CrashJournal(components.crash_guard))
    app.add_service(LoopLag())
    app.add_service(
        SpendFollower(
            ChangelogFollower(
                settings.kafka_client(client_id="dlqapp-spend-view"),
                components.topology.stats.changelog_topic.get_topic_name(),
                components.spend_view.on_record,
                read_committed=settings.exactly_once,
                caught_up=components.spend_view.ready,
            ),
            components.spend_view,
            components.scheduler,
        )
    )
    if components.alerts is not None:
        app.add_service(AlertWebhook(components.alerts))
    if components.tracing.enabled:
        app.add_service(TracingFlush(components.tracing))
    if components.steps.exactly_once:
        app.add_service(
            TransactionCommits(components.steps, settings.commit_interval_ms, lambda exc: fail_transactions(app, exc))
        )


def register_metrics(app: DlqApp, components: Components) -> None:
    """The gauges and the state collector, read from the components when scraped."""
    install_counting_monitor(app)
    limiter = components.caller.limiter
    metrics.concurrency_limit.set_function(lambda: limiter.limit)
    metrics.calls_in_flight.set_function(lambda: limiter.in_use)
    metrics.worker_ready.set_function(lambda: 1.0 if worker_readiness(app).ready else 0.0)
    metrics.worker_start_time.set_to_current_time()
    tail_read = components.tail_read
    metrics.tail_read_partitions.set_function(lambda: len(tail_read.reading) if tail_read is not None else 0)
    stats = components.topology.stats
    metrics.budget_held.set_function(lambda: max(0, components.counters.total_of(stats)["budget_held_now"]))
    metrics.register_state_collector(
        metrics.StateCollector(
            dlq_entries=lambda: max(0, components.counters.total_of(stats)["dlq_size"]),
            parked_by_tier=components.parked.by_tier_label,
            consumer_lag=lambda: consumer_lag(app, set(components.settings.all_topics())),
            breaker_state=lambda: components.caller.breaker.state,
            breaker_moves=lambda: dict(components.caller.breaker.moves),
        )
    )
