"""What the HTTP routes do, over one worker's components: reads routed to the owner or
fanned out to every worker and merged, mutations sent as commands to the owning worker
(`dlqapp.deadletters.operator`)."""

from __future__ import annotations

import asyncio
import inspect
import logging
from pathlib import Path
from typing import Any, Awaitable, Callable

import aiohttp
import aiohttp.web
from faust import web
from yarl import URL

from dlqapp import __version__
from dlqapp.api.http import ApiError, force_of
from dlqapp.core import states
from dlqapp.core.states import RequestState, StateRecord
from dlqapp.core.commands import Action, Command, ReplayStatus, check_edit
from dlqapp.deadletters.entries import DeadLetterEntry, find_dead_letter, owner_id
from dlqapp.deadletters.estimate import METHOD as ESTIMATE_METHOD
from dlqapp.deadletters.estimate import estimated_tokens
from dlqapp.deadletters.queries import (
    DlqFilter,
    local_page,
    local_stats,
    merge_pages,
    merge_stats,
    newest_first,
)
from dlqapp.kafka.faust_compat import (
    active_partitions,
    consumer_lag,
    values_newest_first,
)
from dlqapp.observability import metrics
from dlqapp.observability.health import merge_health
from dlqapp.retries.listing import RetryFilter, local_retries, merge_retries
from dlqapp.tables.counters import grouped

log = logging.getLogger("dlqapp.api.service")

ASK_TIMEOUT_S = 30.0
FANOUT_TIMEOUT_S = 10.0
ROUTE_TIMEOUT_S = 10.0
UI_PAGE = Path(__file__).parent / "ui" / "index.html"
DRY_RUN_SAMPLE = 10
ESTIMATE_KEYS_MAX = 200
"""A dry run of a replay by keys estimates tokens over at most this many of them (scaled)."""


def owner_url(hosts: dict[str, dict[str, list[int]]], partition: int) -> str | None:
    """The worker (URL) whose active partitions of a table include `partition`, from a
    table's assignment (`app.router.table_metadata`: URL -> {changelog topic: partitions})."""
    for url, topics in hosts.items():
        if any(partition in partitions for partitions in topics.values()):
            return url
    return None


class Api:
    """What the routes do, over one worker's components (`dlqapp.wiring.composition`)."""

    def __init__(self, app: Any, parts: Any, operator_agent: Any) -> None:
        self.app = app
        self.parts = parts
        self.settings = parts.settings
        self.topology = parts.topology
        self.operator_agent = operator_agent

    # -- reaching other workers ---------------------------------------------------------

    async def routed(self, view: web.View, request: web.Request, table_name: str, key: str) -> web.Response | None:
        """The owning worker's answer for `key`, or None when this worker owns it.

        The owner is found by dlqapp's own partitioning of the request id (the partition its
        state was written to) and the group's current assignment; not by Faust's router, which
        hashes the key with the producer's topic metadata: that metadata loses every topic but
        the newest one each time the producer first sends to a topic created since its last
        full refresh (an `ask()` reply topic), and routing then failed with a TypeError.
        """
        partition = self.parts.io.owner(owner_id(key))
        url = owner_url(self.app.router.table_metadata(table_name), partition)
        if url is None:
            raise ApiError(503, f"no worker owns partition {partition} of {table_name} now (a rebalance?); try again")
        if self._is_self(url):
            return None
        target = URL(url).with_path(request.rel_url.path).with_query(request.rel_url.query)
        try:
            async with self.app.http_client.request(request.method, target, headers=request.headers, timeout=aiohttp.ClientTimeout(total=ROUTE_TIMEOUT_S)) as response:
                return view.text(await response.text(), content_type=response.content_type, status=response.status)
        except Exception as exc:  # the owner is unreachable (stopping, or mid-rebalance)
            raise ApiError(503, f"the worker owning {key!r} did not answer ({type(exc).__name__}); try again") from None

    async def ask(self, command: Command) -> dict[str, Any]:
        """Run a command on the worker owning its request id and return its answer."""
        partition = self.parts.io.owner(owner_id(command.request_id))
        try:
            return await asyncio.wait_for(
                self.operator_agent.ask(value=command.to_dict(), key=command.request_id.encode(), partition=partition), ASK_TIMEOUT_S
            )
        except asyncio.TimeoutError:
            return {"request_id": command.request_id, "status": ReplayStatus.ERROR, "reason": f"no answer within {ASK_TIMEOUT_S:.0f}s (is a rebalance running?)"}

    def _is_self(self, url: str) -> bool:
        return url.rstrip("/") == str(self.app.conf.canonical_url).rstrip("/")

    async def fan_out(self, local: Callable[[], Any], path: str, params: Any) -> tuple[list[dict[str, Any]], list[str]]:
        """This worker's answer plus every other worker's answer to `path` (local routes).

        `local()` may return the answer or an awaitable of it; `params` is a dict or (name, value) pairs."""
        hosts = [h for h in self.app.router.table_metadata(self.topology.dead_letters.name) if not self._is_self(h)]
        mine = local()
        answers = [await mine if inspect.isawaitable(mine) else mine]
        errors: list[str] = []

        async def remote(host: str) -> None:
            url = f"{str(host).rstrip('/')}{path}"
            try:
                async with self.app.http_client.get(url, params=params, timeout=aiohttp.ClientTimeout(total=FANOUT_TIMEOUT_S)) as response:
                    response.raise_for_status()
                    answers.append(await response.json())
            except Exception as exc:  # one unreachable worker must not hide the others
                errors.append(f"{host}: {type(exc).__name__}: {exc}")

        await asyncio.gather(*(remote(h) for h in hosts))
        return answers, errors

    # -- reads ----------------------------------------------------------------------------

    def local_dlq_page(self, flt: DlqFilter, top: int) -> dict[str, Any]:
        """This worker's share of a listing, read newest first from the DLQ time index."""
        index = self.topology.dead_letters_by_time
        walks = [values_newest_first(index, partition) for partition in active_partitions(index)]
        by_class = grouped(self.parts.counters.total_of(self.topology.stats), "dlq_class")
        return local_page(newest_first(walks), flt, top, by_class)

    def local_stats(self) -> dict[str, Any]:
        stats = local_stats(self.parts.counters.total_of(self.topology.stats), self.parts.oldest_dead_letter.get())
        stats["breaker"] = {str(self.app.conf.canonical_url): self.parts.caller.breaker.snapshot()}
        stats["flow"] = {str(self.app.conf.canonical_url): self.flow()}
        return stats

    async def list_dead_letters(self, flt: DlqFilter, limit: int, offset: int) -> dict[str, Any]:
        """One page of the whole DLQ, newest first."""
        top = offset + limit
        pages, errors = await self.fan_out(lambda: self.local_dlq_page(flt, top), "/dlq/_local/", {**flt.to_params(), "top": str(top)})
        merged = merge_pages(pages, limit, offset)
        if errors:
            merged["incomplete"] = errors
        return merged

    async def stats(self) -> dict[str, Any]:
        parts, errors = await self.fan_out(self.local_stats, "/dlq/_local_stats/", {})
        stats = merge_stats(parts, self.parts.clock())
        if errors:
            stats["incomplete"] = errors
        return stats

    def dead_letter(self, request_id: str) -> dict[str, Any]:
        """One entry of this worker, with its ledger; ApiError 404 when there is none."""
        ledger = self.parts.operator.ledger_for(owner_id(request_id))
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
        in_flight = request_id in self.parts.pipeline.in_flight
        if blob is None and not in_flight:
            raise ApiError(404, f"unknown request id {request_id!r}")
        record = StateRecord.decode(blob)
        state = record.as_dict() if record is not None else {"request_id": request_id, "history": []}
        if in_flight:
            state["state"] = RequestState.IN_FLIGHT
        state["ledger"] = self.parts.operator.ledger_for(request_id)
        parked = self.parts.parked
        hint = state.get("due") if isinstance(state.get("due"), int) else None
        # a walk only when a retry is due by the state (or there is no state): a lookup of a
        # settled request costs one read, not a walk of its partition's parked retries
        walk = state.get("state") in (None, states.RETRY_SCHEDULED)
        keys = await parked.keys_of(request_id, self.parts.io.owner(request_id), hint, walk=walk)
        logs: dict[str, list[dict[str, Any]]] = {states.SUCCEEDED: state.pop("attempt_log", None) or []}
        state["parked"] = []
        for key in keys:
            envelope = parked.get(key)
            if envelope is not None:
                state["parked"].append({"tier": parked.tier_of(envelope).label, "due_at": envelope.due_ms, "attempt": envelope.attempts + 1, "firing": self.parts.scheduler.is_firing(key)})
                logs[states.RETRY_SCHEDULED] = envelope.history
        key = find_dead_letter(self.topology.dead_letters, request_id, self.settings.partitions)
        state["dead_letter"] = None
        if key is not None:
            entry = DeadLetterEntry.decode(self.topology.dead_letters[key])
            state["dead_letter"] = entry.summary()
            logs[states.DEAD_LETTERED] = entry.history or []
        # the attempt history of the request's current state; else the longest one known
        # (`attempts` stays the count the state records)
        state["attempt_history"] = logs.get(state.get("state")) or max(logs.values(), key=len)
        return state

    def status(self) -> dict[str, Any]:
        """What this worker is and where to go next."""
        app = self.app
        return {
            "app": "dlqapp",
            "version": __version__,
            "app_id": self.settings.app_id,
            "ready": bool(app.assignor.assigned_actives()) and not app.rebalancing and not getattr(app, "in_recovery", False),
            "url": str(app.conf.canonical_url),
            "assigned_partitions": len(app.assignor.assigned_actives()),
            "assignment": self._assignment(),
            "topics": self.settings.all_topics(),
            "inference": self.parts.backend.name,
            "in_flight": len(self.parts.pipeline.in_flight),
            "concurrency_limit": self.parts.caller.limiter.limit,
            "flow": self.flow(),
            "admin_page": "/ui/",
        }

    def flow(self) -> dict[str, Any]:
        """Flow control on this worker: the adaptive limit, waiters by priority, rate limits per model."""
        caller = self.parts.caller
        return {**caller.limiter.snapshot(), "rate_limit_share": round(caller.gate.share, 4), "rate_limits": caller.gate.snapshot()}

    def _assignment(self) -> dict[str, list[int]]:
        """Active partitions per topic on this worker (tables show as their changelog topics)."""
        by_topic: dict[str, list[int]] = {}
        for tp in self.app.assignor.assigned_actives():
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        return {topic: sorted(partitions) for topic, partitions in sorted(by_topic.items())}

    # -- mutations ------------------------------------------------------------------------

    async def bulk_keys(self, body: Any) -> tuple[list[str], float | None]:
        if not isinstance(body, dict):
            raise ApiError(400, 'body must be {"keys": [...]} or {"all": true, ...filters}')
        rate = body.get("rate")
        if rate is not None and (not isinstance(rate, (int, float)) or isinstance(rate, bool) or rate <= 0):
            raise ApiError(400, "rate must be a positive number of replays per second")
        if "keys" in body:
            keys = body["keys"]
            if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k for k in keys):
                raise ApiError(400, "keys must be a non-empty list of request ids")
            return list(dict.fromkeys(keys)), rate
        if body.get("all") is True:
            flt = DlqFilter.from_params({k: v for k, v in body.items() if k in ("error_class", "model", "since", "until", "q")})
            page = await self.list_dead_letters(flt, limit=10**9, offset=0)
            return [item.get("key") or item["request_id"] for item in page["items"]], rate
        raise ApiError(400, 'body must name "keys" (a list) or "all": true')

    async def bulk_replay(self, body: Any, actor: str) -> tuple[dict[str, Any], int]:
        keys, rate = await self.bulk_keys(body)
        force = force_of(body)
        dry_run = body.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise ApiError(400, "dry_run must be true or false")
        if dry_run:
            return await self.dry_run(body, keys), 200
        jobs = self.parts.replay_jobs

        def replay(rid: str) -> Awaitable[dict[str, Any]]:
            return self.ask(Command(Action.REPLAY, rid, actor, force=force))

        if rate:
            job = jobs.start(keys, rate, replay)
            return {"replay_id": job.id, "total": len(keys), "rate": rate, "status_url": f"/dlq/replays/{job.id}/"}, 202
        return await jobs.run_now(keys, replay), 200

    async def dry_run(self, body: dict[str, Any], keys: list[str]) -> dict[str, Any]:
        """What a bulk replay would send: exact count, sample ids, estimated prompt tokens."""
        answer: dict[str, Any] = {"dry_run": True, "total": len(keys), "sample": keys[:DRY_RUN_SAMPLE], "estimate": ESTIMATE_METHOD}
        if "keys" in body:
            sampled = keys[:ESTIMATE_KEYS_MAX]
            parts, errors = await self.fan_out(lambda: self.local_estimate(sampled, None), "/dlq/_local_estimate/", [("key", k) for k in sampled])
            counted = sum(p["entries"] for p in parts)
            tokens = sum(p["tokens"] for p in parts)
            if len(keys) > len(sampled) and counted:
                tokens = round(tokens / counted * len(keys))
                answer["estimate"] += f", scaled from the first {len(sampled)} keys"
        else:
            flt = DlqFilter.from_params({k: v for k, v in body.items() if k in ("error_class", "model", "since", "until", "q")})
            parts, errors = await self.fan_out(lambda: self.local_estimate(None, flt), "/dlq/_local_estimate/", flt.to_params())
            tokens = sum(p["tokens"] for p in parts)
        answer["estimated_prompt_tokens"] = tokens
        if errors:
            answer["incomplete"] = errors
        return answer

    def local_estimate(self, keys: list[str] | None, flt: DlqFilter | None) -> dict[str, int]:
        """Estimated prompt tokens of this worker's dead letters among `keys`, or matching `flt`."""
        table = self.topology.dead_letters
        if keys is None:
            index = self.topology.dead_letters_by_time
            walks = [values_newest_first(index, partition) for partition in active_partitions(index)]
            keys = [item.get("key") or item["request_id"] for item in newest_first(walks) if flt is None or flt.matches(item)]
        tokens = entries = 0
        for key in keys:
            found = find_dead_letter(table, key, self.settings.partitions)
            if found is not None:
                entry = DeadLetterEntry.decode(table[found])
                tokens += estimated_tokens(entry.payload_text, entry.payload_bytes)
                entries += 1
        return {"tokens": tokens, "entries": entries}

    # -- retries ----------------------------------------------------------------------

    def _firing(self, key: bytes, request_id: str) -> bool:
        return self.parts.scheduler.is_firing(key) or request_id in self.parts.pipeline.in_flight

    async def local_retries(self, flt: RetryFilter, top: int) -> dict[str, Any]:
        return await local_retries(self.parts.parked, self._firing, flt, top)

    async def list_retries(self, flt: RetryFilter, limit: int, offset: int) -> dict[str, Any]:
        """One page of the parked retries of every worker, earliest due first."""
        top = offset + limit
        pages, errors = await self.fan_out(lambda: self.local_retries(flt, top), "/retries/_local/", {**flt.to_params(), "top": str(top)})
        merged = merge_retries(pages, limit, offset)
        if errors:
            merged["incomplete"] = errors
        return merged

    # -- health -----------------------------------------------------------------------

    def local_health(self, lateness_window_ms: int | None = None) -> dict[str, Any]:
        """This worker's share of the health panel (retry lateness over the last
        `lateness_window_ms`, at most and by default 5 minutes)."""
        parts, now = self.parts, self.parts.clock()
        next_due, earliest = parts.parked.next_due()
        late_ms = parts.caller.lateness.p99_ms(now, lateness_window_ms)
        breaker = parts.caller.breaker.snapshot()
        breaker.pop("transitions", None)
        return {
            "url": str(self.app.conf.canonical_url),
            "series": parts.rates.series(now),
            "in_flight": len(parts.pipeline.in_flight),
            "breaker": breaker,
            "parked_by_tier": parts.parked.by_tier_label(),
            "next_due_by_tier": next_due,
            "oldest_overdue_ms": (now - earliest) if earliest is not None and earliest < now else None,
            "consumer_lag": sum(lag for _, _, lag in consumer_lag(self.app, set(self.settings.all_topics()))),
            "retry_lateness_p99_s": None if late_ms is None else late_ms / 1000,
            "retry_lateness_by_tier": parts.caller.lateness.summary(now, lateness_window_ms),
            "event_loop_lag_s": metrics.loop_lag._value.get(),
        }

    async def health(self, lateness_window_ms: int | None = None) -> dict[str, Any]:
        params = {} if lateness_window_ms is None else {"window": f"{lateness_window_ms}ms"}
        parts, errors = await self.fan_out(lambda: self.local_health(lateness_window_ms), "/health/_local/", params)
        return merge_health(parts, errors, self.parts.clock())

    async def replay(self, request_id: str, body: Any, actor: str) -> dict[str, Any]:
        payload, force = None, False
        if body is not None:
            if not isinstance(body, dict) or set(body) - {"payload", "force"}:
                raise ApiError(400, 'body must be empty or {"payload": {...}, "force": true|false}')
            payload = body.get("payload")
            force = force_of(body)
        if payload is not None:
            problems = check_edit(owner_id(request_id), payload)
            if problems:
                raise ApiError(400, "edited payload is not a valid request", reasons=problems)
        return await self.ask(Command(Action.REPLAY, request_id, actor, payload, force))
