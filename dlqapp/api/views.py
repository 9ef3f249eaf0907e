"""HTTP routes served by every worker: the DLQ API, request status, retries, health, the admin page."""

from __future__ import annotations

from typing import Any, cast

import aiohttp
import aiohttp.web
from faust import web
from multidict import MultiMapping
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from dlqapp.api.http import (
    ApiError,
    actor_of,
    budget_of,
    command_response,
    handled,
    lateness_window,
    optional_limit,
    read_json,
    top_of,
)
from dlqapp.api.service import UI_PAGE, Api
from dlqapp.core.commands import Action, Command
from dlqapp.deadletters.queries import (
    DlqFilter,
    page_params,
)
from dlqapp.retries.listing import RetryFilter


def register_views(app: Any, api: Api) -> None:
    """Register every HTTP route on `app`."""

    @app.page("/")
    async def index(self: web.View, request: web.Request) -> web.Response:
        """What this worker is and where to go next."""
        return self.json(api.status())

    @app.page("/livez")
    async def livez(self: web.View, request: web.Request) -> web.Response:
        """Liveness: 200 whenever the event loop gets to answer (no other check)."""
        return self.json({"alive": True})

    @app.page("/readyz")
    async def readyz(self: web.View, request: web.Request) -> web.Response:
        """Readiness: 200 once topics are checked, partitions assigned and tables recovered,
        while the worker is not stopping; 503 with the reason otherwise."""
        state = api.readiness()
        return self.json({"ready": state.ready, "reason": state.reason}, status=200 if state.ready else 503)

    @app.page("/dlq/")
    @handled
    async def dlq_list(self: web.View, request: web.Request) -> web.Response:
        """`GET /dlq/?limit=&offset=&error_class=&model=&since=&until=&q=` → `{"total", "items"}`."""
        limit, offset = page_params(request.query)
        return self.json(await api.list_dead_letters(DlqFilter.from_params(request.query), limit, offset))

    @app.page("/dlq/_local/")
    @handled
    async def dlq_local(self: web.View, request: web.Request) -> web.Response:
        """This worker's share of a listing (used by the fan-out)."""
        return self.json(api.local_dlq_page(DlqFilter.from_params(request.query), int(request.query.get("top", "50"))))

    @app.page("/dlq/stats/")
    @handled
    async def dlq_stats(self: web.View, request: web.Request) -> web.Response:
        """Counts across all workers: received, succeeded, retried per tier, DLQ by class, …"""
        return self.json(await api.stats())

    @app.page("/dlq/_local_stats/")
    async def dlq_local_stats(self: web.View, request: web.Request) -> web.Response:
        """This worker's share of the stats (used by the fan-out)."""
        return self.json(api.local_stats())

    @app.page("/dlq/_local_estimate/")
    @handled
    async def dlq_local_estimate(self: web.View, request: web.Request) -> web.Response:
        """Estimated prompt tokens of this worker's dead letters (`key=` repeated, or filters)."""
        # faust types `query` as a Mapping; its aiohttp driver's is a MultiDictProxy (repeated keys)
        keys = request.query.getall("key", [])  # type: ignore[attr-defined]
        return self.json(
            api.replays.local_estimate(keys, None)
            if keys
            else api.replays.local_estimate(None, DlqFilter.from_params(request.query))
        )

    @app.page("/dlq/reprocess/")
    class BulkReprocess(web.View):
        """`POST /dlq/reprocess/` with `{"keys": [...]}` or `{"all": true, <filters>}`, optional `"force"`;
        `"rate"` or `"background"` run it as a job (202)."""

        @handled
        async def post(self, request: web.Request) -> web.Response:
            api.require_ready()  # the keys come from every worker's tables: none may be recovering
            answer, status = await api.replays.bulk_replay(await read_json(request), actor_of(request))
            return self.json(answer, status=status)

    @app.page("/dlq/replays/{replay_id}/")
    @handled
    async def replay_progress(self: web.View, request: web.Request, replay_id: str) -> web.Response:
        """Progress of a bulk replay started in the background on this worker."""
        job = api.components.replay_jobs.get(replay_id)
        if job is None:
            raise ApiError(404, f"no bulk replay {replay_id!r} on this worker")
        return self.json(job.progress())

    @app.page("/dlq/{request_id}/reprocess/")
    class Reprocess(web.View):
        """`POST /dlq/{id}/reprocess/`, optionally `{"payload": {...}, "force": true}`."""

        @handled
        async def post(self, request: web.Request, request_id: str) -> web.Response:
            return command_response(
                self, await api.replays.replay(request_id, await read_json(request), actor_of(request))
            )

    @app.page("/dlq/{request_id}/")
    class DeadLetterView(web.View):
        """`GET` one entry (payload, headers, history, ledger) or `DELETE` it (discard)."""

        @handled
        async def get(self, request: web.Request, request_id: str) -> web.Response:
            answer = await api.cluster.routed(self, request, api.topology.dead_letters.name, request_id)
            return answer if answer is not None else self.json(api.dead_letter(request_id))

        @handled
        async def delete(self, request: web.Request, request_id: str) -> web.Response:
            return command_response(self, await api.cluster.ask(Command(Action.DISCARD, request_id, actor_of(request))))

    @app.page("/requests/{request_id}/")
    @handled
    async def request_status(self: web.View, request: web.Request, request_id: str) -> web.Response:
        """Current state and history of one request (answered by the worker that owns it)."""
        answer = await api.cluster.routed(self, request, api.topology.requests.name, request_id)
        return answer if answer is not None else self.json(await api.request_status(request_id))

    @app.page("/retries/")
    @handled
    async def retries(self: web.View, request: web.Request) -> web.Response:
        """`GET /retries/?limit=&offset=&tier=&error_class=` → `{"total", "items", "by_tier", "by_error_class"}`."""
        limit, offset = page_params(request.query)
        return self.json(await api.list_retries(RetryFilter.from_params(request.query), limit, offset))

    @app.page("/retries/_local/")
    @handled
    async def retries_local(self: web.View, request: web.Request) -> web.Response:
        """This worker's share of the retries view (used by the fan-out)."""
        top = top_of(request.query)
        return self.json(await api.local_retries(RetryFilter.from_params(request.query), top))

    @app.page("/retries/{request_id}/run-now/")
    class RunNow(web.View):
        """`POST /retries/{id}/run-now/`: attempt a parked retry now (on the owning worker)."""

        @handled
        async def post(self, request: web.Request, request_id: str) -> web.Response:
            await read_json(request)
            return command_response(self, await api.cluster.ask(Command(Action.RUN_NOW, request_id, actor_of(request))))

    @app.page("/retries/{request_id}/dead-letter/")
    class DeadLetterNow(web.View):
        """`POST /retries/{id}/dead-letter/`: send a parked retry to the DLQ now, with its history."""

        @handled
        async def post(self, request: web.Request, request_id: str) -> web.Response:
            await read_json(request)
            return command_response(
                self, await api.cluster.ask(Command(Action.DEAD_LETTER_NOW, request_id, actor_of(request)))
            )

    @app.page("/budgets/")
    class Budgets(web.View):
        """`GET /budgets/`: spent and left per tenant (and model) in the current UTC day and month
        (`?limit=N`: the N tenants that spent the most this month, `tenants_total` counts all);
        `POST /budgets/` `{"tenant": "acme", "day_usd": 5, "month_usd": 100}` (or `"model"`, or
        `"tenant": "*"`) sets a budget at run time, kept where every worker reads it."""

        @handled
        async def get(self, request: web.Request) -> web.Response:
            return self.json(api.components.spending.report(optional_limit(request.query)))

        @handled
        async def post(self, request: web.Request) -> web.Response:
            key, limits = budget_of(await read_json(request))
            return command_response(
                self, await api.cluster.ask(Command(Action.SET_BUDGET, key, actor_of(request), payload=limits))
            )

    @app.page("/health/")
    @handled
    async def health(self: web.View, request: web.Request) -> web.Response:
        """Health of every worker and in total: rates per minute, breaker, parked, lag, alerts;
        `?window=15s`: retry lateness over that last while (default and most: 5 min)."""
        return self.json(await api.health(lateness_window(request)))

    @app.page("/health/_local/")
    async def health_local(self: web.View, request: web.Request) -> web.Response:
        """This worker's share of the health panel (used by the fan-out)."""
        return self.json(api.local_health(lateness_window(request)))

    @app.page("/inference/calls/{request_id}/")
    async def backend_calls(self: web.View, request: web.Request, request_id: str) -> web.Response:
        """Backend calls this worker has made for a request id (for tests and audits)."""
        return self.json({"request_id": request_id, "calls": api.components.backend.calls_for(request_id)})

    @app.page("/metrics")
    async def prometheus_metrics(self: web.View, request: web.Request) -> web.Response:
        """Prometheus text format: Faust's `faust_*` and dlqapp's `dlqapp_*` metrics; only the
        samples named by `name[]` when given (as Prometheus' own clients serve them)."""
        query = cast(MultiMapping[str], request.query)  # aiohttp's query under Faust's type
        names = [name for name in query.getall("name[]", []) if name]  # a blank one names nothing, as in Prometheus
        registry = REGISTRY.restricted_registry(names) if names else REGISTRY
        # faust's aiohttp driver serves aiohttp's Response as is; faust's Response type is another class
        return aiohttp.web.Response(  # type: ignore[return-value]
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    @app.page("/ui/")
    async def admin_page(self: web.View, request: web.Request) -> web.Response:
        """The admin page: one static HTML file, no build step."""
        return self.html(UI_PAGE.read_text(encoding="utf-8"))
