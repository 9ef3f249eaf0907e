"""Commands on a running worker's parked retries and requests over HTTP (DLQ_WEB_URL)."""

from __future__ import annotations

from typing import Any

from faust.cli import argument, option

from dlqapp.cli.base import EXIT_NOT_FOUND, JSON, call, command, emit, query_of, run, segment, table, when
from dlqapp.core.clock import now_ms
from dlqapp.settings import Settings


@command(
    option("--limit", type=int, default=20, show_default=True, help="How many entries."),
    option("--offset", type=int, default=0, help="Skip this many (earliest due first)."),
    option("--tier", default=None, help="Only this tier (e.g. retry-1m)."),
    option("--error-class", default=None, help="Only this error class."),
    JSON,
)
async def dlq_retries(
    self: Any, limit: int, offset: int, tier: str | None, error_class: str | None, as_json: bool
) -> None:
    """List parked retries of every worker, earliest due first."""
    settings: Settings = self.app.dlq_settings

    async def go() -> None:
        params = {"limit": limit, "offset": offset, "tier": tier, "error_class": error_class}
        _, page = await call(settings, "GET", f"/retries/?{query_of(params)}")
        now = now_ms()
        rows = [
            [
                i["request_id"],
                i["tier"],
                i["attempt"],
                f"{when(i['due_at'])} ({relative(i['due_at'] - now)})",
                i.get("error_class") or "-",
                (i.get("last_error") or "")[:60],
            ]
            for i in page["items"]
        ]
        tiers = ", ".join(f"{t}: {n}" for t, n in sorted(page["by_tier"].items())) or "-"
        emit(
            page,
            as_json,
            f"{table(rows, ['REQUEST', 'TIER', 'ATTEMPT', 'DUE', 'CLASS', 'LAST ERROR'])}\n"
            f"{len(rows)} of {page['total']} parked retries (by tier: {tiers})",
        )

    await run(go())


def relative(ms: int) -> str:
    """`in 3m 5s` or `12s ago`."""
    seconds = abs(ms) // 1000
    text = (
        f"{seconds // 3600}h {seconds % 3600 // 60}m"
        if seconds >= 3600
        else f"{seconds // 60}m {seconds % 60}s"
        if seconds >= 60
        else f"{seconds}s"
    )
    return f"in {text}" if ms >= 0 else f"{text} ago"


async def _retry_action(settings: Settings, keys: tuple[str, ...], action: str, done: str, as_json: bool) -> None:
    answers = [
        (await call(settings, "POST", f"/retries/{segment(key)}/{action}/", {}, ok=(200, 404, 409)))[1] for key in keys
    ]
    emit(
        answers,
        as_json,
        "\n".join(
            f"{a['request_id']}: {a['status']}" + (f" ({a['reason']})" if a.get("reason") else "") for a in answers
        ),
    )
    if any(a["status"] != done for a in answers):
        raise SystemExit(EXIT_NOT_FOUND)


@command(
    option("--key", "keys", multiple=True, required=True, help="The request id of a parked retry (repeatable)."),
    option("--dead-letter", is_flag=True, default=False, help="Send it to the DLQ now instead of attempting it."),
    JSON,
)
async def retry_now(self: Any, keys: tuple[str, ...], dead_letter: bool, as_json: bool) -> None:
    """Attempt parked retries now (their owning worker fires them like the timer would), or dead-letter them."""
    settings: Settings = self.app.dlq_settings
    action, done = ("dead-letter", "dead_lettered") if dead_letter else ("run-now", "fired")
    await run(_retry_action(settings, keys, action, done, as_json))


@command(argument("request_id"), JSON)
async def request_status(self: Any, request_id: str, as_json: bool) -> None:
    """Current state and history of one request."""
    settings: Settings = self.app.dlq_settings

    async def go() -> None:
        _, state = await call(settings, "GET", f"/requests/{segment(request_id)}/")
        rows = [
            [when(h["at"]), h["state"], h.get("error_class") or "", h.get("tier") or ""]
            for h in state.get("history", [])
        ]
        held = f" ({state.get('held_because')})" if state["state"] == "budget_held" else ""
        emit(state, as_json, f"{request_id}: {state['state']}{held}\n{table(rows, ['AT', 'STATE', 'CLASS', 'TIER'])}")

    await run(go())
