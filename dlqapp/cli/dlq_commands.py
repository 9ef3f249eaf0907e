"""Commands on a running worker's DLQ over HTTP (DLQ_WEB_URL): list, show, replay, discard, stats."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from faust.cli import argument, option

from dlqapp.cli.base import (
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    JSON,
    CliError,
    call,
    command,
    emit,
    progress,
    query_of,
    run,
    segment,
    table,
    when,
)
from dlqapp.core.commands import BULK_OUTCOMES
from dlqapp.settings import Settings


def money_line(money: dict[str, Any] | None) -> str:
    """The money of a replay dry run, on one line (empty without one)."""
    if not money:
        return ""
    tokens = money["tokens"]
    line = (
        f"\nreplaying would cost about {money['cost_usd']:.6f} USD ({tokens['prompt']} prompt + "
        f"{tokens['completion']} completion tokens): {money['from_recorded_usage']} from recorded usage, "
        f"{money['from_estimate']} estimated"
    )
    if money.get("unpriced"):
        line += f", {money['unpriced']} on models without a price"
    return line + f"; already spent on them: {money['spent_so_far_usd']:.6f} USD"


def money_lines(stats: dict[str, Any]) -> list[str]:
    """The money part of `dlq-stats`: tokens, cost, the cost of requests that still failed, held requests."""
    money = stats.get("money")
    if not money:
        return []
    tokens = money["tokens"]
    lines = [
        f"cost                {money['cost_usd']:.6f} USD ({tokens['prompt']} prompt tokens, "
        f"{tokens['cached']} cached, {tokens['completion']} completion; "
        f"{money['estimated_prompt_tokens']} prompt tokens estimated)",
        f"spent on requests that still failed: {money['failed_cost_usd']:.6f} USD",
    ]
    lines.extend(f"  {name:<30}{usd:.6f} USD" for name, usd in money["failed_cost_usd_by_class"].items())
    if money.get("unpriced_attempts"):
        lines.append(f"attempts on models without a price: {money['unpriced_attempts']} (tokens only)")
    lines.append(f"held over budget    {stats.get('budget_held', 0)}")
    return lines


@command(
    option("--limit", type=int, default=10, show_default=True, help="How many entries."),
    option("--offset", type=int, default=0, help="Skip this many (newest first)."),
    option("--error-class", default=None, help="Only this error class."),
    option("--model", default=None, help="Only this model."),
    option("--q", "text", default=None, help="Only entries whose error contains this text."),
    JSON,
)
async def dlq_list(
    self: Any, limit: int, offset: int, error_class: str | None, model: str | None, text: str | None, as_json: bool
) -> None:
    """List dead letters, newest first (`--limit 10`: the last ten)."""
    settings: Settings = self.app.dlq_settings

    async def go() -> None:
        params = {"limit": limit, "offset": offset, "error_class": error_class, "model": model, "q": text}
        _, page = await call(settings, "GET", f"/dlq/?{query_of(params)}")
        rows = [
            [
                i["request_id"],
                i["error_class"],
                i.get("model") or "-",
                when(i.get("dead_at")),
                (i.get("final_error") or "")[:70],
            ]
            for i in page["items"]
        ]
        emit(
            page,
            as_json,
            f"{table(rows, ['REQUEST', 'CLASS', 'MODEL', 'DEAD AT', 'ERROR'])}\n"
            f"{len(rows)} of {page['total']} dead letters",
        )

    await run(go())


@command(argument("request_id"), JSON)
async def dlq_show(self: Any, request_id: str, as_json: bool) -> None:
    """Show one dead letter: payload, headers, attempt history, replay ledger."""
    settings: Settings = self.app.dlq_settings

    async def go() -> None:
        _, entry = await call(settings, "GET", f"/dlq/{segment(request_id)}/")
        history = [
            [a["attempt"], when(a["at"]), a["topic"], a.get("error_class") or "-", (a.get("error") or "")[:60]]
            for a in entry.get("history", [])
        ]
        human = "\n".join(
            [
                f"request_id   {entry['request_id']}",
                f"error_class  {entry['error_class']}",
                f"final_error  {entry.get('final_error')}",
                f"model        {entry.get('model') or '-'}",
                f"first seen   {when(entry.get('first_seen'))}",
                f"dead at      {when(entry.get('dead_at'))}",
                "",
                "payload:",
                json.dumps(entry.get("payload"), indent=2)
                if entry.get("payload") is not None
                else f"<{entry.get('payload_bytes')} bytes, base64 {entry.get('payload_b64')}>",
                "",
                "attempts:",
                table(history, ["#", "AT", "TOPIC", "CLASS", "ERROR"]) if history else "(none)",
                "",
                f"replays: {len(entry.get('ledger', []))}",
            ]
        )
        emit(entry, as_json, human)

    await run(go())


@command(
    option("--key", "keys", multiple=True, help="A request id to reprocess (repeatable)."),
    option("--all", "everything", is_flag=True, default=False, help="Every dead letter matching the filters."),
    option("--error-class", default=None, help="With --all: only this error class."),
    option("--rate", type=float, default=None, help="With --all: at most this many replays per second."),
    option(
        "--force",
        is_flag=True,
        default=False,
        help="Replay even requests that have succeeded since (the model is called again).",
    ),
    option(
        "--dry-run",
        is_flag=True,
        default=False,
        help="Replay nothing: show how many would be replayed, some of their ids and the estimated prompt tokens.",
    ),
    JSON,
)
async def dlq_reprocess(
    self: Any,
    keys: tuple[str, ...],
    everything: bool,
    error_class: str | None,
    rate: float | None,
    force: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Send dead letters back to `input` with a clean retry count."""
    settings: Settings = self.app.dlq_settings

    async def go() -> None:
        if bool(keys) == everything:
            raise CliError("give --key ID (one or more) or --all", EXIT_USAGE)
        if dry_run:
            body: dict[str, Any] = (
                {"keys": list(keys)} if keys else {"all": True, **({"error_class": error_class} if error_class else {})}
            )
            _, answer = await call(settings, "POST", "/dlq/reprocess/", {**body, "dry_run": True})
            sample = ", ".join(answer["sample"]) or "-"
            human = (
                f"would reprocess {answer['total']} dead letters (nothing was sent)\nsample: {sample}\n"
                f"estimated prompt tokens: {answer['estimated_prompt_tokens']} ({answer['estimate']})"
                + money_line(answer.get("money"))
            )
            emit(answer, as_json, human)
            return
        if everything:
            report = await _reprocess_all(settings, error_class, rate, force, quiet=as_json)
        else:
            report = {status.value: [] for status in BULK_OUTCOMES}
            for n, key in enumerate(keys, 1):
                _, answer = await call(
                    settings,
                    "POST",
                    f"/dlq/{segment(key)}/reprocess/",
                    {"force": True} if force else None,
                    ok=(200, 404, 409, 400),
                )
                report.setdefault(answer.get("status", "error"), report["error"]).append(key)
                if not as_json and len(keys) > 1:
                    progress(n, len(keys), "reprocessing")
        human = "\n".join(
            f"{outcome}: {len(ids)}" + (f"  ({', '.join(ids[:10])})" if ids else "")
            for outcome, ids in report.items()
            if ids or outcome == "reprocessed"
        )
        emit(report, as_json, human)
        if keys and not report["reprocessed"]:
            raise SystemExit(EXIT_NOT_FOUND)

    await run(go())


async def _reprocess_all(
    settings: Settings, error_class: str | None, rate: float | None, force: bool, quiet: bool
) -> dict[str, Any]:
    # always in the background, its progress asked for: thousands of replays outlast an HTTP answer
    body: dict[str, Any] = {"all": True, "force": force, "background": True}
    if error_class:
        body["error_class"] = error_class
    if rate is not None:
        body["rate"] = rate
    _, job = await call(settings, "POST", "/dlq/reprocess/", body, ok=(202,))
    while True:
        _, state = await call(settings, "GET", job["status_url"])
        if not quiet:
            progress(state["done"], state["total"], "reprocessing")
        if state["state"] == "done":
            return {status.value: state[status] for status in BULK_OUTCOMES}
        await asyncio.sleep(0.5)


@command(option("--key", "keys", multiple=True, required=True, help="A request id to discard (repeatable)."), JSON)
async def dlq_discard(self: Any, keys: tuple[str, ...], as_json: bool) -> None:
    """Remove dead letters for good (recorded in the ledger)."""
    settings: Settings = self.app.dlq_settings

    async def go() -> None:
        answers = [(await call(settings, "DELETE", f"/dlq/{segment(key)}/", ok=(200, 404)))[1] for key in keys]
        emit(answers, as_json, "\n".join(f"{a['request_id']}: {a['status']}" for a in answers))
        if any(a["status"] != "discarded" for a in answers):
            raise SystemExit(EXIT_NOT_FOUND)

    await run(go())


@command(JSON)
async def dlq_stats(self: Any, as_json: bool) -> None:
    """Counts: received, succeeded, retried per tier, dead letters by class, replays."""
    settings: Settings = self.app.dlq_settings

    async def go() -> None:
        _, stats = await call(settings, "GET", "/dlq/stats/")
        lines = [
            f"{k:<20}{stats[k]}" for k in ("received", "succeeded", "duplicates_skipped", "reprocessed", "dlq_size")
        ]
        for title, key in (
            ("retried", "retried"),
            ("dead-lettered", "dead_lettered"),
            ("in the DLQ", "dlq_by_error_class"),
        ):
            lines.append(f"{title}:")
            lines.extend(f"  {name:<30}{n}" for name, n in sorted(stats[key].items()))
            if not stats[key]:
                lines.append("  -")
        for url, flow in sorted(stats.get("flow", {}).items()):
            lines.append(
                f"concurrency limit   {flow['concurrency_limit']} of {flow['concurrency_max']}, "
                f"{flow['calls_in_flight']} calls in flight ({url})"
            )
        lines.extend(money_lines(stats))
        emit(stats, as_json, "\n".join(lines))

    await run(go())
