"""`dlqapp-mock-llm`: an OpenAI-compatible mock model server with a control plane.

    dlqapp-mock-llm --port 8000 --latency-ms 100 --jitter-ms 20 --fail 503=0.05,429=0.02 --seed 1
    dlqapp-mock-llm --limit-rpm 600 --limit-tpm 100000
    dlqapp-mock-llm --fail-once 503=0.2 --fail-always 401=0.01

`--fail` fails a share of *calls* at random. `--fail-once` and `--fail-always` fail a share
of *requests* (by `X-Request-ID`, drawn from a hash of the id, so the same ids fail in every
run): `--fail-once` their first call only (a flaky provider: the retry succeeds),
`--fail-always` every call (a request the provider never serves).

`--limit-rpm`/`--limit-tpm` enforce a provider's limits per model: a call over them is
answered at once with 429 `rate_limit_exceeded` and `retry-after`/`retry-after-ms` (the time
until capacity). Like providers that enforce per-minute limits over shorter windows, each
limit is a token bucket holding one second of it (at least one request), full at start;
a call costs one request and the `total_tokens` its usage reports.

Serves `POST /v1/chat/completions` (OpenAI response shape). Control plane:

- `POST /_mock/plan` `{"request_id", "fail_times", "status", "retry_after", "retry_after_ms",
  "error": {"code", "message"}, "headers": {...}, "timeout": false}`: the next `fail_times`
  calls for that id fail that way (`status: "timeout"` or `"timeout": true` hangs).
- `GET /_mock/calls/{request_id}`: calls received for that id (`GET /_mock/calls`: all ids).
- `GET /_mock/stats`: calls, successes and failures by status; `throttled`: the 429s the
  limits sent (by model in `throttled_by_model`); `tokens`: the ledger of tokens served in
  answers (`prompt`, `completion`, `cached`, `reasoning`), as their `usage` reported them.
- `GET /_mock/usage/{request_id}`: that ledger for one request id.
- `GET /_mock/call-log` (`?request_id=` for one id's): with `--log-calls`, every call in
  arrival order, `{"enabled", "calls": [{"request_id", "at_ms", "status"}]}`.
- `POST /_mock/outage` `{"on": true, "status": 503}`: every call fails like a dead provider.
- `POST /_mock/reset`: forget plans, counts and the outage.

Usage is reported like OpenAI's: `prompt_tokens` (4 characters a token, 4 a message),
`completion_tokens`, `prompt_tokens_details.cached_tokens` (a prefix of every message but the
last, of `--cache-min-tokens` (1,024) tokens or more, seen before: in steps of 128) and
`completion_tokens_details.reasoning_tokens` (64 when the request names a `reasoning_effort`).
Failed calls report no usage.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
from collections.abc import Mapping

from aiohttp import web

from dlqapp.devtools.mock_behaviour import (
    HANG_S,
    TIMEOUT,
    CallLog,
    MockState,
    Plan,
    ProviderLimits,
    completion,
    failure_response,
    outage_failure,
    over_limit,
    parse_mix,
    planned_failure,
    random_failure,
    request_failure,
)

log = logging.getLogger("dlqapp.devtools.mock_llm")


def build_app(state: MockState) -> web.Application:
    """The mock's aiohttp application."""
    routes = web.RouteTableDef()

    @routes.post("/v1/chat/completions")
    async def chat(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return failure_response(400)
        request_id = request.headers.get("X-Request-ID", "")
        state.calls[request_id] += 1
        logged = state.call_log.arrived(request_id) if state.call_log is not None else {}
        throttled = over_limit(state, request_id, body)
        if throttled is not None:
            state.outcomes["429"] += 1
            logged["status"] = 429
            return throttled
        delay = max(0.0, state.latency_ms + (state.rng.random() * 2 - 1) * state.jitter_ms) / 1000
        await asyncio.sleep(delay)
        failure = (
            planned_failure(state, request_id)
            or outage_failure(state)
            or request_failure(state, request_id)
            or random_failure(state)
        )
        if failure == TIMEOUT:
            state.outcomes[TIMEOUT] += 1
            logged["status"] = TIMEOUT
            await asyncio.sleep(HANG_S)  # the client's timeout ends the call
        if isinstance(failure, web.Response):
            state.outcomes[str(failure.status)] += 1
            logged["status"] = failure.status
            return failure
        state.outcomes["200"] += 1
        logged["status"] = 200
        answer = completion(request_id, body)
        state.cache(body, answer["usage"])
        state.served(request_id, answer["usage"])
        return web.json_response(answer)

    @routes.post("/_mock/plan")
    async def plan(request: web.Request) -> web.Response:
        spec = await request.json()
        request_id = spec["request_id"]
        timeout = spec.get("timeout") or spec.get("status") == TIMEOUT
        state.plans[request_id] = Plan(
            remaining=int(spec.get("fail_times", 1)),
            status=TIMEOUT if timeout else int(spec.get("status", 503)),
            retry_after=spec.get("retry_after"),
            retry_after_ms=spec.get("retry_after_ms"),
            error=spec.get("error"),
            headers=spec.get("headers") or {},
        )
        return web.json_response({"planned": request_id})

    @routes.get("/_mock/calls")
    async def all_calls(request: web.Request) -> web.Response:
        return web.json_response(dict(state.calls))

    @routes.get("/_mock/calls/{request_id}")
    async def calls(request: web.Request) -> web.Response:
        request_id = request.match_info["request_id"]
        return web.json_response({"request_id": request_id, "calls": state.calls[request_id]})

    @routes.get("/_mock/stats")
    async def stats(request: web.Request) -> web.Response:
        limits = state.limits
        return web.json_response(
            {
                "calls": sum(state.calls.values()),
                "ids": len(state.calls),
                "by_status": dict(state.outcomes),
                "outage": state.outage_status is not None,
                "throttled": sum(limits.throttled.values()) if limits else 0,
                "throttled_by_model": dict(limits.throttled) if limits else {},
                "tokens": {k: state.ledger[k] for k in ("prompt", "completion", "cached", "reasoning")},
            }
        )

    @routes.get("/_mock/usage/{request_id}")
    async def usage(request: web.Request) -> web.Response:
        request_id = request.match_info["request_id"]
        served: Mapping[str, int] = state.ledger_by_id.get(request_id, {})
        return web.json_response(
            {"request_id": request_id, **{k: served.get(k, 0) for k in ("prompt", "completion", "cached", "reasoning")}}
        )

    @routes.get("/_mock/call-log")
    async def call_log(request: web.Request) -> web.Response:
        log = state.call_log
        calls = log.of(request.query.get("request_id")) if log is not None else []
        return web.json_response({"enabled": log is not None, "calls": calls})

    @routes.post("/_mock/outage")
    async def outage(request: web.Request) -> web.Response:
        spec = await request.json()
        state.outage_status = int(spec.get("status", 503)) if spec.get("on") else None
        return web.json_response({"outage": state.outage_status is not None})

    @routes.post("/_mock/reset")
    async def reset(request: web.Request) -> web.Response:
        state.plans.clear()
        state.calls.clear()
        state.outcomes.clear()
        state.ledger.clear()
        state.ledger_by_id.clear()
        state.prefixes.clear()
        state.outage_status = None
        if state.limits is not None:
            state.limits.reset()
        if state.call_log is not None:
            state.call_log.clear()
        return web.json_response({"reset": True})

    app = web.Application()
    app.add_routes(routes)
    return app


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def main(argv: list[str] | None = None) -> None:
    """Run the mock server (console script `dlqapp-mock-llm`)."""
    parser = argparse.ArgumentParser(
        prog="dlqapp-mock-llm", description="OpenAI-compatible mock model server for dlqapp."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--latency-ms", type=float, default=100.0, help="fixed latency per call")
    parser.add_argument("--jitter-ms", type=float, default=0.0, help="uniform ± jitter on the latency")
    parser.add_argument(
        "--fail", type=parse_mix, default=[], help="failure mix, e.g. 500=0.02,503=0.03,429=0.02,timeout=0.01,400=0.01"
    )
    parser.add_argument(
        "--fail-once", type=parse_mix, default=[], help="shares of request ids whose first call fails, e.g. 503=0.2"
    )
    parser.add_argument(
        "--fail-always", type=parse_mix, default=[], help="shares of request ids whose every call fails, e.g. 401=0.01"
    )
    parser.add_argument("--retry-after", type=float, default=1.0, help="retry-after seconds on random 429s")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--log-calls",
        action="store_true",
        help="keep every call's arrival time and status (GET /_mock/call-log); off: memory stays flat",
    )
    parser.add_argument(
        "--limit-rpm",
        type=_positive,
        default=None,
        help="requests per minute per model; more are answered 429 with retry-after",
    )
    parser.add_argument(
        "--limit-tpm",
        type=_positive,
        default=None,
        help="tokens (usage.total_tokens) per minute per model; more are answered 429",
    )
    parser.add_argument(
        "--cache-min-tokens",
        type=int,
        default=1024,
        help="a prompt prefix (every message but the last) this long, seen before, is reported as cached tokens",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    state = MockState(
        args.latency_ms,
        args.jitter_ms,
        args.fail,
        args.retry_after,
        random.Random(args.seed),
        once=args.fail_once,
        always=args.fail_always,
        cache_min_tokens=max(1, args.cache_min_tokens),
    )
    if sum(share for _, share in [*args.fail_once, *args.fail_always]) > 1:
        parser.error("--fail-once and --fail-always shares add up to more than 1")
    if args.limit_rpm or args.limit_tpm:
        state.limits = ProviderLimits(args.limit_rpm, args.limit_tpm)
    if args.log_calls:
        state.call_log = CallLog()
    print(
        f"dlqapp-mock-llm on http://{args.host}:{args.port}/v1 (latency {args.latency_ms:g}±{args.jitter_ms:g} ms)",
        flush=True,
    )
    _use_uvloop()
    web.run_app(build_app(state), host=args.host, port=args.port, print=None, access_log=None, shutdown_timeout=1.0)


def _use_uvloop() -> None:
    """Serve on uvloop when it is installed: the mock must never be what limits a benchmark."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


if __name__ == "__main__":
    main()
