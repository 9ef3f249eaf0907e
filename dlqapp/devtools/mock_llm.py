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
  limits sent (by model in `throttled_by_model`).
- `POST /_mock/outage` `{"on": true, "status": 503}`: every call fails like a dead provider.
- `POST /_mock/reset`: forget plans, counts and the outage.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from dlqapp.flowcontrol.bucket import TokenBucket

log = logging.getLogger("dlqapp.devtools.mock_llm")
TIMEOUT = "timeout"
HANG_S = 3600.0

ERROR_BODIES: dict[int, dict[str, str]] = {
    400: {"type": "invalid_request_error", "code": "invalid_request", "message": "mock: bad request"},
    429: {"type": "rate_limit_error", "code": "rate_limit_exceeded", "message": "mock: rate limited"},
    500: {"type": "server_error", "code": "internal_error", "message": "mock: internal error"},
    503: {"type": "server_error", "code": "overloaded", "message": "mock: service unavailable"},
}


def parse_mix(text: str) -> list[tuple[str, float]]:
    """`503=0.05,429=0.02,timeout=0.01` → [("503", 0.05), …]."""
    mix = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, share = part.partition("=")
        if kind != TIMEOUT and not kind.isdigit():
            raise argparse.ArgumentTypeError(f"{kind!r} is not a status code or 'timeout'")
        mix.append((kind, float(share)))
    if sum(s for _, s in mix) > 1:
        raise argparse.ArgumentTypeError("failure shares add up to more than 1")
    return mix


@dataclass
class Plan:
    """Failures planned for one request id."""

    remaining: int
    status: int | str = 503
    retry_after: float | None = None
    retry_after_ms: int | None = None
    error: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class MockState:
    latency_ms: float
    jitter_ms: float
    mix: list[tuple[str, float]]
    retry_after: float
    rng: random.Random
    plans: dict[str, Plan] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    outage_status: int | None = None
    limits: "ProviderLimits | None" = None
    once: list[tuple[str, float]] = field(default_factory=list)
    always: list[tuple[str, float]] = field(default_factory=list)


class ProviderLimits:
    """Requests and tokens per minute per model, enforced like a provider (see the module doc)."""

    def __init__(self, rpm: float | None, tpm: float | None, clock: Any = time.monotonic) -> None:
        self.rpm, self.tpm = rpm, tpm
        self._clock = clock
        self._buckets: dict[str, tuple[TokenBucket | None, TokenBucket | None]] = {}
        self.throttled: Counter[str] = Counter()

    def _bucket(self, per_minute: float | None) -> TokenBucket | None:
        if per_minute is None:
            return None
        rate = per_minute / 60
        capacity = max(1.0, rate)
        return TokenBucket(rate, capacity, self._clock, initial=capacity)

    def admit(self, model: str, tokens: int) -> float:
        """0 when the call may go (its cost is taken), else the seconds until it could."""
        if model not in self._buckets:
            self._buckets[model] = (self._bucket(self.rpm), self._bucket(self.tpm))
        requests, token_bucket = self._buckets[model]
        wait = max(requests.wait_s(1) if requests else 0.0, token_bucket.wait_s(tokens) if token_bucket else 0.0)
        if wait > 0:
            self.throttled[model] += 1
            return wait
        if requests:
            requests.take(1)
        if token_bucket:
            token_bucket.take(tokens)
        return 0.0

    def reset(self) -> None:
        self._buckets.clear()
        self.throttled.clear()


def failure_response(status: int, error: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> web.Response:
    body = {"error": error or ERROR_BODIES.get(status, {"type": "error", "code": str(status), "message": f"mock: HTTP {status}"})}
    return web.json_response(body, status=status, headers=headers or {})


def completion(request_id: str, body: dict[str, Any]) -> dict[str, Any]:
    messages = body.get("messages") or []
    prompt = str(messages[-1].get("content", "")) if messages and isinstance(messages[-1], dict) else ""
    text = f"mock answer to: {prompt[:200]}"
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or "mock-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split()), "total_tokens": len(prompt.split()) + len(text.split())},
    }


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
        throttled = _over_limit(state, request_id, body)
        if throttled is not None:
            state.outcomes["429"] += 1
            return throttled
        delay = max(0.0, state.latency_ms + (state.rng.random() * 2 - 1) * state.jitter_ms) / 1000
        await asyncio.sleep(delay)
        failure = _planned_failure(state, request_id) or _outage(state) or _request_failure(state, request_id) or _random_failure(state)
        if failure == TIMEOUT:
            state.outcomes[TIMEOUT] += 1
            await asyncio.sleep(HANG_S)  # the client's timeout ends the call
        if isinstance(failure, web.Response):
            state.outcomes[str(failure.status)] += 1
            return failure
        state.outcomes["200"] += 1
        return web.json_response(completion(request_id, body))

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
        return web.json_response({
            "calls": sum(state.calls.values()),
            "ids": len(state.calls),
            "by_status": dict(state.outcomes),
            "outage": state.outage_status is not None,
            "throttled": sum(limits.throttled.values()) if limits else 0,
            "throttled_by_model": dict(limits.throttled) if limits else {},
        })

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
        state.outage_status = None
        if state.limits is not None:
            state.limits.reset()
        return web.json_response({"reset": True})

    app = web.Application()
    app.add_routes(routes)
    return app


Failure = web.Response | str | None
"""A response to send instead of a completion, TIMEOUT to hang, or None."""


def _over_limit(state: MockState, request_id: str, body: Any) -> web.Response | None:
    """A provider's 429 when the call's model is over `--limit-rpm`/`--limit-tpm`."""
    if state.limits is None or not isinstance(body, dict):
        return None
    tokens = completion(request_id, body)["usage"]["total_tokens"]
    wait = state.limits.admit(str(body.get("model") or "mock-model"), tokens)
    if wait <= 0:
        return None
    headers = {"retry-after": str(max(1, math.ceil(wait))), "retry-after-ms": str(max(1, math.ceil(wait * 1000)))}
    error = {"type": "rate_limit_error", "code": "rate_limit_exceeded", "message": f"mock: rate limit reached; try again in {wait * 1000:.0f} ms"}
    return failure_response(429, error, headers)


def _planned_failure(state: MockState, request_id: str) -> Failure:
    plan = state.plans.get(request_id)
    if plan is None or plan.remaining <= 0:
        return None
    plan.remaining -= 1
    if plan.status == TIMEOUT:
        return TIMEOUT
    headers = dict(plan.headers)
    if plan.retry_after is not None:
        headers["retry-after"] = str(plan.retry_after)
    if plan.retry_after_ms is not None:
        headers["retry-after-ms"] = str(plan.retry_after_ms)
    return failure_response(int(plan.status), plan.error, headers)


def _outage(state: MockState) -> web.Response | None:
    if state.outage_status is None:
        return None
    return failure_response(state.outage_status)


def request_share(request_id: str) -> float:
    """Where a request id falls in [0, 1): the same for every run and every process."""
    return int.from_bytes(hashlib.sha1(request_id.encode()).digest()[:8], "big") / 2**64


def _request_failure(state: MockState, request_id: str) -> Failure:
    """`--fail-once` then `--fail-always`, as consecutive bands of the id's share."""
    if not (state.once or state.always) or not request_id:
        return None
    roll = request_share(request_id)
    for kind, share in state.once:
        if roll < share:
            return _failure_of(kind, state) if state.calls[request_id] == 1 else None
        roll -= share
    for kind, share in state.always:
        if roll < share:
            return _failure_of(kind, state)
        roll -= share
    return None


def _failure_of(kind: str, state: MockState) -> Failure:
    if kind == TIMEOUT:
        return TIMEOUT
    status = int(kind)
    return failure_response(status, headers={"retry-after": str(state.retry_after)} if status == 429 else {})


def _random_failure(state: MockState) -> Failure:
    roll = state.rng.random()
    for kind, share in state.mix:
        if roll < share:
            if kind == TIMEOUT:
                return TIMEOUT
            status = int(kind)
            headers = {"retry-after": str(state.retry_after)} if status == 429 else {}
            return failure_response(status, headers=headers)
        roll -= share
    return None


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    return value


def main(argv: list[str] | None = None) -> None:
    """Run the mock server (console script `dlqapp-mock-llm`)."""
    parser = argparse.ArgumentParser(prog="dlqapp-mock-llm", description="OpenAI-compatible mock model server for dlqapp.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--latency-ms", type=float, default=100.0, help="fixed latency per call")
    parser.add_argument("--jitter-ms", type=float, default=0.0, help="uniform ± jitter on the latency")
    parser.add_argument("--fail", type=parse_mix, default=[], help="failure mix, e.g. 500=0.02,503=0.03,429=0.02,timeout=0.01,400=0.01")
    parser.add_argument("--fail-once", type=parse_mix, default=[], help="shares of request ids whose first call fails, e.g. 503=0.2")
    parser.add_argument("--fail-always", type=parse_mix, default=[], help="shares of request ids whose every call fails, e.g. 401=0.01")
    parser.add_argument("--retry-after", type=float, default=1.0, help="retry-after seconds on random 429s")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--limit-rpm", type=_positive, default=None, help="requests per minute per model; more are answered 429 with retry-after")
    parser.add_argument("--limit-tpm", type=_positive, default=None, help="tokens (usage.total_tokens) per minute per model; more are answered 429")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    state = MockState(args.latency_ms, args.jitter_ms, args.fail, args.retry_after, random.Random(args.seed), once=args.fail_once, always=args.fail_always)
    if sum(share for _, share in [*args.fail_once, *args.fail_always]) > 1:
        parser.error("--fail-once and --fail-always shares add up to more than 1")
    if args.limit_rpm or args.limit_tpm:
        state.limits = ProviderLimits(args.limit_rpm, args.limit_tpm)
    print(f"dlqapp-mock-llm on http://{args.host}:{args.port}/v1 (latency {args.latency_ms:g}±{args.jitter_ms:g} ms)", flush=True)
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
