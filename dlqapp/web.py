"""HTTP routes served by every worker: the DLQ API, request status, the admin page.

Reads of one id are routed to the worker that owns it; lists and stats fan out to every
worker and merge; mutations become commands for the owning worker (`dlqapp.operator`).
"""

from __future__ import annotations

import asyncio

import aiohttp
import json
import logging
from pathlib import Path
from typing import Any, Awaitable, Callable

from faust import web
from faust.exceptions import SameNode

from dlqapp import __version__
from dlqapp.agents import backend, counters, operator, operator_agent, pipeline, scheduler
from dlqapp.app import app, settings
from dlqapp.dlq import OldestDeadLetter, find_dead_letter, owner_id, presented
from dlqapp.faust_compat import active_partitions, read_partition
from dlqapp.models import now_ms
from dlqapp.operator import DISCARD, REPLAY, Command, check_edit
from dlqapp.partitioning import owner_partition
from dlqapp.queries import BadQuery, DlqFilter, local_page, local_stats, merge_pages, merge_stats, page_params
from dlqapp.replays import ReplayJobs
from dlqapp.topology import dead_letters, requests_table, stats_table

log = logging.getLogger("dlqapp.web")

ASK_TIMEOUT_S = 30.0
FANOUT_TIMEOUT_S = 10.0
UI_PAGE = Path(__file__).parent / "ui" / "index.html"
STATUS_CODES = {"reprocessed": 200, "discarded": 200, "not_found": 404, "refused": 409, "invalid": 400, "error": 500}

jobs = ReplayJobs()


class ApiError(Exception):
    """An error answered as `{"error": message}` with an HTTP status."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


def _error(view: web.View, exc: ApiError) -> web.Response:
    return view.json({"error": exc.message, **exc.extra}, status=exc.status)


def api(handler: Callable[..., Awaitable[web.Response]]) -> Callable[..., Awaitable[web.Response]]:
    """Turn `ApiError` and `BadQuery` raised by a handler into JSON error responses."""

    async def wrapper(self: web.View, request: web.Request, **kwargs: Any) -> web.Response:
        try:
            return await handler(self, request, **kwargs)
        except ApiError as exc:
            return _error(self, exc)
        except BadQuery as exc:
            return self.json({"error": str(exc)}, status=400)

    wrapper.__name__ = handler.__name__
    wrapper.__doc__ = handler.__doc__
    return wrapper


async def read_json(request: web.Request) -> Any:
    """The request body as JSON, or ApiError 400 naming the problem."""
    body = await request.read()
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None


def actor_of(request: web.Request) -> str:
    """Who asked: the X-DLQ-Actor header, else the client address."""
    return (request.headers.get("X-DLQ-Actor") or f"api@{request.remote}")[:200]


async def routed(view: web.View, request: web.Request, table_name: str, key: str) -> web.Response | None:
    """The owning worker's answer for `key`, or None when this worker owns it."""
    try:
        return await app.router.route_req(table_name, owner_id(key).encode(), view.web, request)
    except SameNode:
        return None
    except Exception as exc:  # the owner is unreachable (stopping, or mid-rebalance)
        raise ApiError(503, f"the worker owning {key!r} did not answer ({type(exc).__name__}); try again") from None


async def ask(command: Command) -> dict[str, Any]:
    """Run a command on the worker owning its request id and return its answer."""
    partition = owner_partition(owner_id(command.request_id), settings.partitions)
    try:
        return await asyncio.wait_for(
            operator_agent.ask(value=command.to_dict(), key=command.request_id.encode(), partition=partition), ASK_TIMEOUT_S
        )
    except asyncio.TimeoutError:
        return {"request_id": command.request_id, "status": "error", "reason": f"no answer within {ASK_TIMEOUT_S:.0f}s (is a rebalance running?)"}


def _answer(view: web.View, result: dict[str, Any]) -> web.Response:
    return view.json(result, status=STATUS_CODES.get(result.get("status", "error"), 500))


# -- fan-out over workers ---------------------------------------------------------------


def _is_self(url: str) -> bool:
    mine = app.conf.canonical_url
    return url.rstrip("/") == str(mine).rstrip("/")


async def fan_out(local: Callable[[], dict[str, Any]], path: str, params: dict[str, str]) -> tuple[list[dict[str, Any]], list[str]]:
    """This worker's answer plus every other worker's answer to `path` (local routes)."""
    hosts = [h for h in app.router.table_metadata(dead_letters.name) if not _is_self(h)]
    answers = [local()]
    errors: list[str] = []

    async def remote(host: str) -> None:
        url = f"{str(host).rstrip('/')}{path}"
        try:
            async with app.http_client.get(url, params=params, timeout=aiohttp.ClientTimeout(total=FANOUT_TIMEOUT_S)) as response:
                response.raise_for_status()
                answers.append(await response.json())
        except Exception as exc:  # one unreachable worker must not hide the others
            errors.append(f"{host}: {type(exc).__name__}: {exc}")

    await asyncio.gather(*(remote(h) for h in hosts))
    return answers, errors


def _local_dlq_page(flt: DlqFilter, top: int) -> dict[str, Any]:
    return local_page(dead_letters.values(), flt, top)


oldest = OldestDeadLetter(dead_letters)


def _local_stats() -> dict[str, Any]:
    total = counters.total(active_partitions(stats_table), lambda partition, key: read_partition(stats_table, partition, key))
    stats = local_stats(total, oldest.get())
    stats["breaker"] = {str(app.conf.canonical_url): pipeline.breaker.snapshot()}
    return stats


async def list_dead_letters(flt: DlqFilter, limit: int, offset: int) -> dict[str, Any]:
    """One page of the whole DLQ, newest first."""
    top = offset + limit
    pages, errors = await fan_out(lambda: _local_dlq_page(flt, top), "/dlq/_local/", {**flt.to_params(), "top": str(top)})
    merged = merge_pages(pages, limit, offset)
    if errors:
        merged["incomplete"] = errors
    return merged


# -- routes -----------------------------------------------------------------------------


def _ready() -> bool:
    """Serving, recovered, and owning partitions."""
    return bool(app.assignor.assigned_actives()) and not app.rebalancing and not getattr(app, "in_recovery", False)


def _assignment() -> dict[str, list[int]]:
    """Active partitions per topic on this worker (tables show as their changelog topics)."""
    by_topic: dict[str, list[int]] = {}
    for tp in app.assignor.assigned_actives():
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return {topic: sorted(parts) for topic, parts in sorted(by_topic.items())}


@app.page("/")
async def index(self: web.View, request: web.Request) -> web.Response:
    """What this worker is and where to go next."""
    return self.json(
        {
            "app": "dlqapp",
            "version": __version__,
            "app_id": settings.app_id,
            "ready": _ready(),
            "url": str(app.conf.canonical_url),
            "assigned_partitions": len(app.assignor.assigned_actives()),
            "assignment": _assignment(),
            "topics": settings.all_topics(),
            "inference": backend.name,
            "in_flight": len(pipeline.in_flight),
            "admin_page": "/ui/",
        }
    )


@app.page("/dlq/")
@api
async def dlq_list(self: web.View, request: web.Request) -> web.Response:
    """`GET /dlq/?limit=&offset=&error_class=&model=&since=&until=&q=` → `{"total", "items"}`."""
    limit, offset = page_params(request.query)
    return self.json(await list_dead_letters(DlqFilter.from_params(request.query), limit, offset))


@app.page("/dlq/_local/")
@api
async def dlq_local(self: web.View, request: web.Request) -> web.Response:
    """This worker's share of a listing (used by the fan-out)."""
    top = int(request.query.get("top", "50"))
    return self.json(_local_dlq_page(DlqFilter.from_params(request.query), top))


@app.page("/dlq/stats/")
@api
async def dlq_stats(self: web.View, request: web.Request) -> web.Response:
    """Counts across all workers: received, succeeded, retried per tier, DLQ by class, …"""
    parts, errors = await fan_out(_local_stats, "/dlq/_local_stats/", {})
    stats = merge_stats(parts, now_ms())
    if errors:
        stats["incomplete"] = errors
    return self.json(stats)


@app.page("/dlq/_local_stats/")
async def dlq_local_stats(self: web.View, request: web.Request) -> web.Response:
    """This worker's share of the stats (used by the fan-out)."""
    return self.json(_local_stats())


@app.page("/dlq/reprocess/")
class BulkReprocess(web.View):
    """`POST /dlq/reprocess/` with `{"keys": [...]}` or `{"all": true, <filters>}`, optional `"rate"`."""

    @api
    async def post(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        keys, rate = await _bulk_keys(body)
        force = _force(body)
        actor = actor_of(request)
        if rate:
            job = jobs.start(keys, rate, lambda rid: ask(Command(REPLAY, rid, actor, force=force)))
            return self.json({"replay_id": job.id, "total": len(keys), "rate": rate, "status_url": f"/dlq/replays/{job.id}/"}, status=202)
        return self.json(await jobs.run_now(keys, lambda rid: ask(Command(REPLAY, rid, actor, force=force))))


async def _bulk_keys(body: Any) -> tuple[list[str], float | None]:
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
        page = await list_dead_letters(flt, limit=10**9, offset=0)
        return [item.get("key") or item["request_id"] for item in page["items"]], rate
    raise ApiError(400, 'body must name "keys" (a list) or "all": true')


@app.page("/dlq/replays/{replay_id}/")
@api
async def replay_progress(self: web.View, request: web.Request, replay_id: str) -> web.Response:
    """Progress of a rate-limited bulk replay started on this worker."""
    job = jobs.get(replay_id)
    if job is None:
        raise ApiError(404, f"no bulk replay {replay_id!r} on this worker")
    return self.json(job.progress())


@app.page("/dlq/{request_id}/reprocess/")
class Reprocess(web.View):
    """`POST /dlq/{id}/reprocess/`, optionally `{"payload": {...}}` to edit first."""

    @api
    async def post(self, request: web.Request, request_id: str) -> web.Response:
        body = await read_json(request)
        payload, force = None, False
        if body is not None:
            if not isinstance(body, dict) or set(body) - {"payload", "force"}:
                raise ApiError(400, 'body must be empty or {"payload": {...}, "force": true|false}')
            payload = body.get("payload")
            force = _force(body)
        if payload is not None:
            problems = check_edit(owner_id(request_id), payload)
            if problems:
                raise ApiError(400, "edited payload is not a valid request", reasons=problems)
        return _answer(self, await ask(Command(REPLAY, request_id, actor_of(request), payload, force)))


def _force(body: dict[str, Any]) -> bool:
    force = body.get("force", False)
    if not isinstance(force, bool):
        raise ApiError(400, "force must be true or false")
    return force


@app.page("/dlq/{request_id}/")
class DeadLetter(web.View):
    """`GET` one entry (payload, headers, history, ledger) or `DELETE` it (discard)."""

    @api
    async def get(self, request: web.Request, request_id: str) -> web.Response:
        answer = await routed(self, request, dead_letters.name, request_id)
        if answer is not None:
            return answer
        ledger = operator.ledger_for(owner_id(request_id))
        key = find_dead_letter(dead_letters, request_id, settings.partitions)
        if key is None:
            raise ApiError(404, f"no dead letter with request id {request_id!r}", ledger=ledger)
        return self.json({**presented(json.loads(dead_letters[key])), "ledger": ledger})

    @api
    async def delete(self, request: web.Request, request_id: str) -> web.Response:
        return _answer(self, await ask(Command(DISCARD, request_id, actor_of(request))))


@app.page("/requests/{request_id}/")
@api
async def request_status(self: web.View, request: web.Request, request_id: str) -> web.Response:
    """Current state and history of one request (answered by the worker that owns it)."""
    answer = await routed(self, request, requests_table.name, request_id)
    if answer is not None:
        return answer
    blob = requests_table.get(request_id.encode())
    in_flight = request_id in pipeline.in_flight
    if blob is None and not in_flight:
        raise ApiError(404, f"unknown request id {request_id!r}")
    state = json.loads(blob) if blob else {"request_id": request_id, "history": []}
    if in_flight:
        state["state"] = "in_flight"
    state["ledger"] = operator.ledger_for(request_id)
    return self.json(state)


@app.page("/retries/")
async def retries(self: web.View, request: web.Request) -> web.Response:
    """Retries parked on this worker's partitions, and those handed to the due agent."""
    return self.json({"parked": await scheduler.parked_count(), "fired": len(scheduler.fired)})


@app.page("/inference/calls/{request_id}/")
async def backend_calls(self: web.View, request: web.Request, request_id: str) -> web.Response:
    """Backend calls this worker has made for a request id (for tests and audits)."""
    return self.json({"request_id": request_id, "calls": backend.calls_for(request_id)})


@app.page("/ui/")
async def admin_page(self: web.View, request: web.Request) -> web.Response:
    """The admin page: one static HTML file, no build step."""
    return self.html(UI_PAGE.read_text(encoding="utf-8"))
