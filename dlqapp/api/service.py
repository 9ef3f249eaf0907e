"""What the HTTP reads do, over one worker's components: routed to the owner or fanned out
to every worker and merged (`dlqapp.api.cluster`); replays are `dlqapp.api.replays`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

import faust
from faust.types import AgentT

from dlqapp import __version__
from dlqapp.api.cluster import Cluster
from dlqapp.api.http import ApiError
from dlqapp.api.replays import Replays
from dlqapp.core import states
from dlqapp.core.backend import InferenceBackend
from dlqapp.core.clock import Clock
from dlqapp.core.states import RequestState, StoredState
from dlqapp.deadletters.entries import DeadLetterEntry, find_dead_letter, owner_id
from dlqapp.deadletters.operator import Operator
from dlqapp.deadletters.queries import (
    DlqFilter,
    local_page,
    local_stats,
    merge_pages,
    merge_stats,
    newest_first,
)
from dlqapp.deadletters.recorder import OldestDeadLetter
from dlqapp.deadletters.replay_jobs import ReplayJobs
from dlqapp.kafka.faust_consumer_state import consumer_lag
from dlqapp.kafka.faust_tables import active_partitions, values_newest_first
from dlqapp.observability import metrics
from dlqapp.observability.health import MinuteRates, Readiness, merge_health, worker_readiness
from dlqapp.processing.caller import BackendCaller
from dlqapp.processing.pipeline import Pipeline
from dlqapp.processing.spend import Spending
from dlqapp.retries.listing import RetryFilter, local_retries, merge_retries
from dlqapp.retries.parked import ParkedRetries
from dlqapp.retries.scheduler import RetryScheduler
from dlqapp.settings import Settings
from dlqapp.tables.counters import Counters, grouped
from dlqapp.tables.request_store import RequestStore
from dlqapp.tables.topology import Topology

log = logging.getLogger("dlqapp.api.service")

UI_PAGE = Path(__file__).parent / "ui" / "index.html"


class WorkerParts(Protocol):
    """What the API reads of a worker's components (dlqapp.wiring.composition.Components)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def topology(self) -> Topology: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def store(self) -> RequestStore: ...

    @property
    def counters(self) -> Counters: ...

    @property
    def caller(self) -> BackendCaller: ...

    @property
    def backend(self) -> InferenceBackend: ...

    @property
    def pipeline(self) -> Pipeline: ...

    @property
    def scheduler(self) -> RetryScheduler: ...

    @property
    def parked(self) -> ParkedRetries: ...

    @property
    def operator(self) -> Operator: ...

    @property
    def replay_jobs(self) -> ReplayJobs: ...

    @property
    def oldest_dead_letter(self) -> OldestDeadLetter: ...

    @property
    def rates(self) -> MinuteRates: ...

    @property
    def spending(self) -> Spending: ...


class Api:
    """What the routes do, over one worker's components (`dlqapp.wiring.composition`)."""

    def __init__(self, app: faust.App, components: WorkerParts, operator_agent: AgentT) -> None:
        self.app = app
        self.components = components
        self.settings = components.settings
        self.topology = components.topology
        self.cluster = Cluster(
            app,
            components.store.owner,
            operator_agent=operator_agent,
            table_name=components.topology.dead_letters.name,
        )
        self.replays = Replays(
            self.cluster,
            components.topology,
            partitions=components.settings.partitions,
            jobs=components.replay_jobs,
            list_dead_letters=self.list_dead_letters,
            prices=components.settings.prices,
            default_model=components.settings.default_model,
        )

    # -- reads ----------------------------------------------------------------------------

    def local_dlq_page(self, flt: DlqFilter, top: int) -> dict[str, Any]:
        """This worker's share of a listing, read newest first from the DLQ time index."""
        index = self.topology.dead_letters_by_time
        walks = [values_newest_first(index, partition) for partition in active_partitions(index)]
        by_class = grouped(self.components.counters.total_of(self.topology.stats), "dlq_class")
        return local_page(newest_first(walks), flt, top=top, by_class=by_class)

    def local_stats(self) -> dict[str, Any]:
        stats = local_stats(
            self.components.counters.total_of(self.topology.stats), self.components.oldest_dead_letter.get()
        )
        stats["breaker"] = {str(self.app.conf.canonical_url): self.components.caller.breaker.snapshot()}
        stats["flow"] = {str(self.app.conf.canonical_url): self.flow()}
        return stats

    async def list_dead_letters(self, flt: DlqFilter, limit: int, offset: int) -> dict[str, Any]:
        """One page of the whole DLQ, newest first."""
        top = offset + limit
        return await self.cluster.merged(
            lambda: self.local_dlq_page(flt, top),
            "/dlq/_local/",
            {**flt.to_params(), "top": str(top)},
            lambda pages: merge_pages(pages, limit, offset),
        )

    async def stats(self) -> dict[str, Any]:
        return await self.cluster.merged(
            self.local_stats,
            "/dlq/_local_stats/",
            {},
            lambda stats: merge_stats(stats, self.components.clock()),
        )

    def dead_letter(self, request_id: str) -> dict[str, Any]:
        """One entry of this worker, with its ledger; ApiError 404 when there is none."""
        ledger = self.components.operator.ledger_for(owner_id(request_id))
        key = find_dead_letter(self.topology.dead_letters, request_id, self.settings.partitions)
        if key is None:
            raise ApiError(404, f"no dead letter with request id {request_id!r}", ledger=ledger)
        return {**DeadLetterEntry.decode(self.topology.dead_letters[key]).presented(), "ledger": ledger}

    async def request_status(self, request_id: str) -> dict[str, Any]:
        """One request's state and history on this worker; ApiError 404 when unknown.

        Adds what the request lookup shows: its parked retries (`parked`), its dead letter
        (`dead_letter`, a summary) and its attempt timeline (`attempts`, from the parked
        envelope or the dead letter, whichever knows more).
        """
        blob = self.topology.requests.get(request_id.encode())
        in_flight = request_id in self.components.pipeline.in_flight
        if blob is None and not in_flight:
            raise ApiError(404, f"unknown request id {request_id!r}")
        record = StoredState.decode(blob)
        state: dict[str, Any] = record.as_dict() if record is not None else {"request_id": request_id, "history": []}
        if in_flight:
            state["state"] = RequestState.IN_FLIGHT
        state["ledger"] = self.components.operator.ledger_for(request_id)
        parked = self.components.parked
        hint = state.get("due") if isinstance(state.get("due"), int) else None
        # a walk only when a retry is due by the state (or there is no state): a lookup of a
        # settled request costs one read, not a walk of its partition's parked retries
        walk = state.get("state") in (None, states.RETRY_SCHEDULED)
        keys = await parked.keys_of(request_id, self.components.store.owner(request_id), hint_due_ms=hint, walk=walk)
        logs: dict[str, list[dict[str, Any]]] = {states.SUCCEEDED: state.pop("attempt_log", None) or []}
        state["parked"] = []
        for key in keys:
            envelope = parked.get(key)
            if envelope is not None:
                state["parked"].append(
                    {
                        "tier": parked.tier_of(envelope).label,
                        "due_at": envelope.due_ms,
                        "attempt": envelope.attempts + 1,
                        "firing": self.components.scheduler.is_handed_over(key),
                    }
                )
                logs[states.RETRY_SCHEDULED] = envelope.history
        dead_key = find_dead_letter(self.topology.dead_letters, request_id, self.settings.partitions)
        state["dead_letter"] = None
        if dead_key is not None:
            entry = DeadLetterEntry.decode(self.topology.dead_letters[dead_key])
            state["dead_letter"] = entry.summary()
            logs[states.DEAD_LETTERED] = entry.history or []
        # the attempt history of the request's current state; else the longest one known
        # (`attempts` stays the count the state records)
        current = state.get("state")
        state["attempt_history"] = (logs.get(current) if current is not None else None) or max(logs.values(), key=len)
        return state

    def status(self) -> dict[str, Any]:
        """What this worker is and where to go next."""
        app = self.app
        return {
            "app": "dlqapp",
            "version": __version__,
            "app_id": self.settings.app_id,
            "ready": self.readiness().ready,
            "url": str(app.conf.canonical_url),
            "assigned_partitions": len(app.assignor.assigned_actives()),
            "assignment": self._assignment(),
            "topics": self.settings.all_topics(),
            "inference": self.components.backend.name,
            "in_flight": len(self.components.pipeline.in_flight),
            "concurrency_limit": self.components.caller.limiter.limit,
            "flow": self.flow(),
            "admin_page": "/ui/",
        }

    def require_ready(self) -> None:
        """ApiError 503 with the reason while this worker is not ready (its tables may be
        recovering: what it would list or count is not the whole truth yet)."""
        state = self.readiness()
        if not state.ready:
            raise ApiError(503, f"this worker is not ready ({state.reason}); try again in a moment")

    def readiness(self) -> Readiness:
        """Whether this worker serves its share now (`GET /readyz`), and why not."""
        return worker_readiness(self.app)

    def flow(self) -> dict[str, Any]:
        """Flow control on this worker: the adaptive limit, waiters by priority, rate limits per model."""
        caller = self.components.caller
        return {
            **caller.limiter.snapshot(),
            "rate_limit_share": round(caller.gate.share, 4),
            "rate_limits": caller.gate.snapshot(),
            "tenants": caller.limiter.tenants_snapshot(),
        }

    def _assignment(self) -> dict[str, list[int]]:
        """Active partitions per topic on this worker (tables show as their changelog topics)."""
        by_topic: dict[str, list[int]] = {}
        for tp in self.app.assignor.assigned_actives():
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        return {topic: sorted(partitions) for topic, partitions in sorted(by_topic.items())}

    # -- retries ----------------------------------------------------------------------

    def _firing(self, key: bytes, request_id: str) -> bool:
        return self.components.scheduler.is_handed_over(key) or request_id in self.components.pipeline.in_flight

    async def local_retries(self, flt: RetryFilter, top: int) -> dict[str, Any]:
        return await local_retries(self.components.parked, self._firing, flt=flt, top=top)

    async def list_retries(self, flt: RetryFilter, limit: int, offset: int) -> dict[str, Any]:
        """One page of the parked retries of every worker, earliest due first."""
        top = offset + limit
        return await self.cluster.merged(
            lambda: self.local_retries(flt, top),
            "/retries/_local/",
            {**flt.to_params(), "top": str(top)},
            lambda pages: merge_retries(pages, limit, offset),
        )

    # -- health -----------------------------------------------------------------------

    def local_health(self, lateness_window_ms: int | None = None) -> dict[str, Any]:
        """This worker's share of the health panel (retry lateness over the last
        `lateness_window_ms`, at most and by default 5 minutes)."""
        components, now = self.components, self.components.clock()
        next_due, earliest = components.parked.next_due()
        late_ms = components.caller.lateness.p99_ms(now, lateness_window_ms)
        breaker = components.caller.breaker.snapshot()
        breaker.pop("transitions", None)
        return {
            "url": str(self.app.conf.canonical_url),
            "series": components.rates.series(now),
            "in_flight": len(components.pipeline.in_flight),
            "breaker": breaker,
            "parked_by_tier": components.parked.by_tier_label(),
            "next_due_by_tier": next_due,
            "oldest_overdue_ms": (now - earliest) if earliest is not None and earliest < now else None,
            "consumer_lag": sum(lag for _, _, lag in consumer_lag(self.app, set(self.settings.all_topics()))),
            "retry_lateness_p99_s": None if late_ms is None else late_ms / 1000,
            "retry_lateness_by_tier": components.caller.lateness.summary(now, lateness_window_ms),
            "event_loop_lag_s": metrics.gauge_value(metrics.loop_lag),
            "budget_held": max(0, components.counters.total_of(self.topology.stats)["budget_held_now"]),
        }

    async def health(self, lateness_window_ms: int | None = None) -> dict[str, Any]:
        params = {} if lateness_window_ms is None else {"window": f"{lateness_window_ms}ms"}
        components, errors = await self.cluster.fan_out(
            lambda: self.local_health(lateness_window_ms), "/health/_local/", params
        )
        return merge_health(components, errors, self.components.clock())
