"""Health at a glance: per-minute rates kept in memory, retry lateness, stall detection,
and whether a worker is ready to serve (`readiness`, behind `GET /readyz`).

Pure code; the clock is passed in. Each worker keeps `MinuteRates`, a ring of the last
`MINUTES` minutes of what its counters saw (received, succeeded, retried, dead-lettered),
so the admin page's chart is there the moment it opens; the web layer fans `/health/`
out to every worker and merges the answers with `merge_health`.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MINUTES = 15
MINUTE_MS = 60_000
SERIES = ("received", "succeeded", "retried", "dead_lettered")
LOOP_LAG_ALERT_S = 1.0
"""Event-loop lag above this is reported as degraded: every retry is delayed by it."""
OVERDUE_ALERT_MS = 30_000
"""A parked retry this far past its due time means the retry timer is not keeping up."""


@dataclass(frozen=True)
class Readiness:
    """Whether a worker serves its share of the work now, and if not, why (in words)."""

    ready: bool
    reason: str


def readiness(
    *, stopping: bool, topics_checked: bool, assigned_partitions: int, rebalancing: bool, recovering: bool
) -> Readiness:
    """A worker is ready once its topics are checked, it owns partitions, no rebalance or
    table recovery is under way, and it is not stopping; the first unmet condition is the reason."""
    if stopping:
        return Readiness(False, "stopping")
    if not topics_checked:
        return Readiness(False, "checking topics")
    if rebalancing:
        return Readiness(False, "rebalancing")
    if recovering:
        return Readiness(False, "recovering tables")
    if assigned_partitions < 1:
        return Readiness(False, "no partitions assigned (more workers than DLQ_PARTITIONS, or not joined yet)")
    return Readiness(True, "ready")


def worker_readiness(app: Any) -> Readiness:
    """The readiness of a running dlqapp Faust app (read from its attributes, duck-typed):
    behind `GET /readyz`, `ready` in `GET /` and the `dlqapp_worker_ready` gauge. Partitions
    count on the input topic only: Faust may hand a worker without work its one-partition
    topics (the leader topic), and every dlqapp topic is partitioned like input."""
    return readiness(
        stopping=bool(app.should_stop),
        topics_checked=bool(getattr(app, "topics_checked", False)),
        assigned_partitions=sum(1 for tp in app.assignor.assigned_actives() if tp.topic == app.dlq_settings.input),
        rebalancing=bool(app.rebalancing),
        recovering=bool(app.tables.recovery.in_recovery),
    )


def series_of(counter_name: str) -> str | None:
    """Which chart series a stats counter (dlqapp.tables.counters) feeds, if any."""
    base = counter_name.split("|", 1)[0]
    return base if base in SERIES else None


class MinuteRates:
    """Counts per minute for the last `minutes` minutes (a ring; older minutes fall off)."""

    def __init__(self, minutes: int = MINUTES) -> None:
        self.minutes = minutes
        self._buckets: deque[tuple[int, Counter[str]]] = deque()

    def add(self, counter_name: str, amount: int, now_ms: int) -> None:
        """Count `amount` of a stats counter at `now_ms` (negative amounts are not rates)."""
        series = series_of(counter_name)
        if series is None or amount <= 0:
            return
        self._bucket(now_ms)[series] += amount

    def _bucket(self, now_ms: int) -> Counter[str]:
        minute = now_ms // MINUTE_MS
        if not self._buckets or self._buckets[-1][0] != minute:
            self._buckets.append((minute, Counter()))
            while self._buckets and self._buckets[0][0] <= minute - self.minutes:
                self._buckets.popleft()
        return self._buckets[-1][1]

    def series(self, now_ms: int) -> list[dict[str, int]]:
        """One point per minute, oldest first, the current (partial) minute last."""
        current = now_ms // MINUTE_MS
        known = dict(self._buckets)
        points = []
        for minute in range(current - self.minutes + 1, current + 1):
            counts = known.get(minute, Counter())
            points.append({"minute": minute * MINUTE_MS, **{name: counts[name] for name in SERIES}})
        return points


def merge_series(series: Iterable[list[dict[str, int]]]) -> list[dict[str, int]]:
    """Sum several workers' minute series point by point (matched by minute)."""
    merged: dict[int, Counter[str]] = {}
    for points in series:
        for point in points:
            merged.setdefault(point["minute"], Counter()).update({k: v for k, v in point.items() if k != "minute"})
    return [{"minute": minute, **{name: counts[name] for name in SERIES}} for minute, counts in sorted(merged.items())]


def worker_alerts(worker: Mapping[str, Any], now_ms: int) -> list[str]:
    """Why one worker is stalled or degraded, in words (empty when it is healthy)."""
    alerts = []
    breaker = worker.get("breaker") or {}
    state = breaker.get("state")
    held = breaker.get("waiting", 0)
    if state == "open" or (state == "half_open" and held):  # half-open with nobody waiting: the next call probes
        since = breaker.get("tripped_since")
        words = ["circuit breaker " + ("open" if state == "open" else "half-open (probing)")]
        if since:
            words.append(f"since {_age(now_ms - since)} ago")
        reopens = breaker.get("reopens_in_ms")
        if reopens is not None:
            words.append(f"next probe in {math.ceil(reopens / 1000)} s")
        words.append(f"{held} requests held")
        lag = worker.get("consumer_lag", 0)
        if lag:
            words.append(f"consumer lag {lag}")
        alerts.append(", ".join(words))
    overdue = worker.get("oldest_overdue_ms")
    if overdue is not None and overdue > OVERDUE_ALERT_MS:
        alerts.append(f"retries overdue: the oldest parked retry is {_age(overdue)} past its due time")
    loop_lag = worker.get("event_loop_lag_s") or 0.0
    if loop_lag > LOOP_LAG_ALERT_S:
        alerts.append(f"event loop lagging {loop_lag:.1f} s (every timer and retry is that late)")
    return alerts


def merge_health(workers: list[dict[str, Any]], unreachable: list[str], now_ms: int) -> dict[str, Any]:
    """Cluster health from every worker's share: totals, per-worker detail, alerts."""
    parked: Counter[str] = Counter()
    next_due: dict[str, int] = {}
    for worker in workers:
        worker["alerts"] = worker_alerts(worker, now_ms)
        parked.update(worker.get("parked_by_tier") or {})
        for tier, due in (worker.get("next_due_by_tier") or {}).items():
            if due is not None and (tier not in next_due or due < next_due[tier]):
                next_due[tier] = due
    lateness = [w["retry_lateness_p99_s"] for w in workers if w.get("retry_lateness_p99_s") is not None]
    alerts = [{"worker": w["url"], "message": message} for w in workers for message in w["alerts"]]
    alerts += [
        {"worker": where.split(": ", 1)[0], "message": "worker did not answer: " + where.split(": ", 1)[-1]}
        for where in unreachable
    ]
    total = {
        "series": merge_series(w.get("series", []) for w in workers),
        "in_flight": sum(w.get("in_flight", 0) for w in workers),
        "held": sum((w.get("breaker") or {}).get("waiting", 0) for w in workers),
        "budget_held": sum(w.get("budget_held", 0) for w in workers),
        "parked_by_tier": dict(parked),
        "next_due_by_tier": next_due,
        "consumer_lag": sum(w.get("consumer_lag", 0) for w in workers),
        "retry_lateness_p99_s": max(lateness) if lateness else None,
        "event_loop_lag_s": max((w.get("event_loop_lag_s") or 0.0 for w in workers), default=0.0),
    }
    status = (
        "stalled"
        if any("breaker" in a["message"] or "did not answer" in a["message"] for a in alerts)
        else "degraded"
        if alerts
        else "ok"
    )
    return {
        "status": status,
        "now": now_ms,
        "alerts": alerts,
        "total": total,
        "workers": sorted(workers, key=lambda w: w["url"]),
    }


def _age(ms: float) -> str:
    seconds = max(0, int(ms // 1000))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
