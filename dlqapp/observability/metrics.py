"""Prometheus metrics: Faust's own sensor plus dlqapp's pipeline metrics, on `/metrics`.

Counters and histograms are updated where things happen; gauges that describe state
(DLQ entries, parked retries, consumer lag, breaker) are read when Prometheus scrapes.
Tier labels are topic names without DLQ_TOPIC_PREFIX (`input`, `retry-1s`, `fallback`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Self

import prometheus_client
from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

prometheus_client.disable_created_metrics()  # no `_created` series next to every counter

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
LATENESS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600)


class _CachedLabels(MetricWrapperBase):
    """`labels(...)` answered from a dict after the first call (prometheus_client validates
    and locks on every call: a measurable share of a worker's CPU on the request path).

    A mixin before the metric class (`class _Counter(_CachedLabels, Counter)`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cached_children: dict[tuple[object, ...], Self] = {}

    def labels(self, *values: object, **named: object) -> Self:
        if named:
            return super().labels(*values, **named)
        child = self._cached_children.get(values)
        if child is None:
            child = self._cached_children[values] = super().labels(*values)
        return child


class _Counter(_CachedLabels, Counter):
    pass


class _Histogram(_CachedLabels, Histogram):
    pass


OTHER = "_other"


class BoundedLabel:
    """Values of a label whose values come from requests (`tenant`, `model`): a value named in
    the settings (`named`) has its own, the others too up to `limit` of them, in the order this
    process first counts them, and the rest are `_other`. A label value per end user would swamp
    Prometheus: 5,000 tenants made one worker's scrape 1.1 MB."""

    def __init__(self, limit: int, named: Callable[[str], bool] = lambda value: False) -> None:
        self.limit = limit
        self.named = named
        self._own: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._own or self.named(value):
            return value
        if len(self._own) < self.limit:
            self._own.add(value)
            return value
        return OTHER


requests = _Counter(
    "dlqapp_requests_total", "Requests by final outcome: succeeded, dead_lettered, duplicate_skipped.", ["outcome"]
)
attempts = _Counter("dlqapp_attempts_total", "Backend attempts by tier (input, retry tiers, fallback).", ["tier"])
dead_letters = _Counter("dlqapp_dead_letters_total", "Dead letters recorded, by error class.", ["error_class"])
duplicates = Counter(
    "dlqapp_duplicates_skipped_total", "Copies of a request that were skipped (already succeeded or in progress)."
)
replays = Counter("dlqapp_replays_total", "Dead letters sent back to input by an operator.")
discards = Counter("dlqapp_discards_total", "Dead letters discarded by an operator.")
started_ahead = _Counter(
    "dlqapp_started_ahead_of_turn_total",
    "Requests the tail read started ahead of their turn, by tenant: read at the end of input while the worker was far "
    "behind (another tenant's flood), DLQ_TAIL_READ_LAG.",
    ["tenant"],
)
offset_gaps = _Counter(
    "dlqapp_consumer_offset_gaps_total",
    "Holes in the offsets a worker was handed, by topic: records skipped without being handled (transaction markers "
    "also leave one).",
    ["topic"],
)
held = Counter(
    "dlqapp_held_during_outage_total", "Backend-wide failures not counted as attempts because the breaker was open."
)
tokens = _Counter(
    "dlqapp_tokens_total",
    "Tokens of backend attempts (the provider's usage, or an estimate for failed calls that reported none), by "
    "model, kind (prompt, completion, cached, reasoning), outcome, error class and tenant.",
    ["model", "kind", "outcome", "error_class", "tenant"],
)
cost = _Counter(
    "dlqapp_cost_usd_total",
    "Cost of backend attempts in US dollars (DLQ_PRICES), by model, outcome, error class and tenant.",
    ["model", "outcome", "error_class", "tenant"],
)
unpriced_attempts = _Counter(
    "dlqapp_unpriced_attempts_total",
    "Attempts on a model DLQ_PRICES has no price for (counted in tokens only).",
    ["model"],
)
budget_holds = _Counter(
    "dlqapp_budget_holds_total",
    "Requests held over a budget (each hold and each re-check that held again), by tenant and the budget passed.",
    ["tenant", "budget"],
)
budget_held = Gauge(
    "dlqapp_budget_held_requests", "Requests held over their budget now, on the partitions this worker owns."
)
backend_latency = _Histogram(
    "dlqapp_backend_call_duration_seconds",
    "Backend call latency by outcome (ok or error class).",
    ["outcome"],
    buckets=LATENCY_BUCKETS,
)
end_to_end = Histogram("dlqapp_end_to_end_latency_seconds", "From first receipt to the result.", buckets=E2E_BUCKETS)
loop_lag = Gauge(
    "dlqapp_event_loop_lag_seconds",
    "How late the event loop ran a 250 ms timer, worst of the last second: work that hogs the loop delays every retry.",
)
concurrency_limit = Gauge(
    "dlqapp_concurrency_limit",
    "Backend calls allowed in flight now: the adaptive limit, between DLQ_CONCURRENCY_FLOOR and DLQ_CONCURRENCY.",
)
calls_in_flight = Gauge("dlqapp_backend_calls_in_flight", "Backend calls in flight now.")
tail_read_partitions = Gauge(
    "dlqapp_tail_read_partitions",
    "Input partitions whose end the worker reads now, its in-order reading being DLQ_TAIL_READ_LAG or more behind.",
)
rate_wait = Histogram(
    "dlqapp_rate_limit_wait_seconds",
    "Time a call waited for DLQ_RATE_LIMITS capacity, by model (`*`: a model the setting does not name).",
    ["model"],
    buckets=(*LATENESS_BUCKETS, 30, 60),
)
worker_ready = Gauge(
    "dlqapp_worker_ready",
    "1 while this worker is ready (GET /readyz answers 200), else 0.",
)
worker_start_time = Gauge(
    "dlqapp_worker_start_time_seconds",
    "When this worker's run began (epoch seconds); a worker that restarts in place (same pid) starts a new run.",
)
lateness = _Histogram(
    "dlqapp_retry_lateness_seconds",
    "Actual attempt time minus scheduled_time, by tier.",
    ["tier"],
    buckets=LATENESS_BUCKETS,
)


class StateCollector(Collector):
    """Gauges computed at scrape time from callables supplied by the app."""

    def __init__(
        self,
        *,
        dlq_entries: Callable[[], int],
        parked_by_tier: Callable[[], dict[str, int]],
        consumer_lag: Callable[[], Iterable[tuple[str, int, int]]],
        breaker_state: Callable[[], str],
        breaker_moves: Callable[[], dict[str, int]],
    ) -> None:
        self.dlq_entries = dlq_entries
        self.parked_by_tier = parked_by_tier
        self.consumer_lag = consumer_lag
        self.breaker_state = breaker_state
        self.breaker_moves = breaker_moves

    def collect(self) -> Iterator[Metric]:
        entries = GaugeMetricFamily("dlqapp_dlq_entries", "DLQ entries on the partitions this worker owns.")
        entries.add_metric([], self.dlq_entries())
        yield entries
        parked = GaugeMetricFamily(
            "dlqapp_parked_retries", "Retries waiting for their due time on this worker, by tier.", labels=["tier"]
        )
        for tier, count in sorted(self.parked_by_tier().items()):
            parked.add_metric([tier], count)
        yield parked
        lag = GaugeMetricFamily(
            "dlqapp_consumer_lag",
            "Messages not yet handled (log end minus the oldest offset read but not acked, else the next to read), "
            "per topic and partition.",
            labels=["topic", "partition"],
        )
        for topic, partition, value in self.consumer_lag():
            lag.add_metric([topic, str(partition)], value)
        yield lag
        breaker = GaugeMetricFamily(
            "dlqapp_breaker_state", "1 for the circuit breaker's current state.", labels=["state"]
        )
        current = self.breaker_state()
        for state in ("closed", "open", "half_open"):
            breaker.add_metric([state], 1.0 if state == current else 0.0)
        yield breaker
        moves = CounterMetricFamily(
            "dlqapp_breaker_transitions", "Circuit breaker transitions, e.g. closed->open.", labels=["transition"]
        )
        for move, count in sorted(self.breaker_moves().items()):
            moves.add_metric([move], count)
        yield moves


def register_state_collector(collector: StateCollector) -> None:
    """Add the scrape-time gauges to the default registry (which /metrics serves)."""
    REGISTRY.register(collector)


def gauge_value(gauge: Gauge) -> float:
    """The value of an unlabelled gauge, read through prometheus_client's public `collect()`."""
    return float(next(iter(gauge.collect())).samples[0].value)
