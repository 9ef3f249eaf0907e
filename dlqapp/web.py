"""HTTP views served by every worker (the operator API grows here)."""

from __future__ import annotations

from faust import web

from dlqapp import __version__
from dlqapp.agents import backend, pipeline, scheduler
from dlqapp.app import app, settings
from dlqapp.topology import dead_letters, requests_table


def _ready() -> bool:
    """Serving, recovered, and owning partitions."""
    return bool(app.assignor.assigned_actives()) and not app.rebalancing and not getattr(app, "in_recovery", False)


@app.page("/")
async def index(self: web.View, request: web.Request) -> web.Response:
    """What this worker is and where to go next."""
    return self.json(
        {
            "app": "dlqapp",
            "version": __version__,
            "app_id": settings.app_id,
            "topics": settings.all_topics(),
            "inference": backend.name,
            "ready": _ready(),
            "assigned_partitions": len(app.assignor.assigned_actives()),
            "in_flight": len(pipeline.in_flight),
            "routes": ["/requests/{request_id}/", "/retries/", "/inference/calls/{request_id}/"],
        }
    )


@app.page("/requests/{request_id}/")
@app.table_route(table=requests_table, match_info="request_id")
async def request_status(self: web.View, request: web.Request, request_id: str) -> web.Response:
    """Current state and history of one request (answered by the worker that owns it)."""
    blob = requests_table.get(request_id.encode())
    if blob is None:
        in_flight = request_id in pipeline.in_flight
        if not in_flight:
            return self.json({"error": f"unknown request id {request_id!r}"}, status=404)
        return self.json({"request_id": request_id, "state": "in_flight"})
    import json

    state = json.loads(blob)
    if request_id in pipeline.in_flight:
        state["state"] = "in_flight"
    return self.bytes(json.dumps(state).encode(), content_type="application/json")


@app.page("/dlq/{request_id}/")
@app.table_route(table=dead_letters, match_info="request_id")
async def dead_letter(self: web.View, request: web.Request, request_id: str) -> web.Response:
    """One DLQ entry: payload, headers, attempt history (answered by the owning worker)."""
    blob = dead_letters.get(request_id.encode())
    if blob is None:
        return self.json({"error": f"no dead letter with request id {request_id!r}"}, status=404)
    return self.bytes(blob, content_type="application/json")


@app.page("/retries/")
async def retries(self: web.View, request: web.Request) -> web.Response:
    """Retries parked on this worker's partitions, and those handed to the due agent."""
    return self.json({"parked": scheduler.parked_count(), "fired": len(scheduler.fired)})


@app.page("/inference/calls/{request_id}/")
async def backend_calls(self: web.View, request: web.Request, request_id: str) -> web.Response:
    """Backend calls this worker has made for a request id (for tests and audits)."""
    return self.json({"request_id": request_id, "calls": backend.calls_for(request_id)})
