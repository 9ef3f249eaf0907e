"""The mock model's behaviour (dlqapp.devtools.mock_llm): completions, the failures it is
told to make (planned per id, per request share, at random, an outage) and a provider's
rate limits."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from dlqapp.flowcontrol.bucket import TokenBucket

TIMEOUT = "timeout"


HANG_S = 3600.0


ERROR_BODIES: dict[int, dict[str, str]] = {
    400: {"type": "invalid_request_error", "code": "invalid_request", "message": "mock: bad request"},
    429: {"type": "rate_limit_error", "code": "rate_limit_exceeded", "message": "mock: rate limited"},
    500: {"type": "server_error", "code": "internal_error", "message": "mock: internal error"},
    503: {"type": "server_error", "code": "overloaded", "message": "mock: service unavailable"},
}


Failure = web.Response | str | None
"""A response to send instead of a completion, TIMEOUT to hang, or None."""


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
    limits: ProviderLimits | None = None
    once: list[tuple[str, float]] = field(default_factory=list)
    always: list[tuple[str, float]] = field(default_factory=list)
    cache_min_tokens: int = 1024
    """A prompt prefix (every message but the last) this long, seen before, is served from cache."""
    prefixes: set[str] = field(default_factory=set)
    ledger: Counter[str] = field(default_factory=Counter)
    """Tokens served in answers (the usage reported): prompt, completion, cached, reasoning."""
    ledger_by_id: dict[str, Counter[str]] = field(default_factory=dict)
    call_log: CallLog | None = None
    """Every call with its arrival time, when `--log-calls` asked for it (else None)."""

    def served(self, request_id: str, usage: dict[str, Any]) -> None:
        """Add an answer's reported usage to the ledger."""
        counts = {
            "prompt": usage["prompt_tokens"],
            "completion": usage["completion_tokens"],
            "cached": usage["prompt_tokens_details"]["cached_tokens"],
            "reasoning": usage["completion_tokens_details"]["reasoning_tokens"],
        }
        self.ledger.update(counts)
        self.ledger_by_id.setdefault(request_id, Counter()).update(counts)

    def cache(self, body: dict[str, Any], usage: dict[str, Any]) -> None:
        """Serve the prompt's prefix from cache when it was seen before (as OpenAI's prompt
        caching does for prefixes of 1,024 tokens and more, in steps of 128)."""
        messages = body.get("messages") or []
        prefix = messages[:-1] if isinstance(messages, list) else []
        tokens = prompt_tokens(prefix)
        if not prefix or tokens < self.cache_min_tokens:
            return
        key = hashlib.sha256(json.dumps(prefix, sort_keys=True).encode()).hexdigest()
        if key in self.prefixes:
            step = min(128, self.cache_min_tokens)
            usage["prompt_tokens_details"]["cached_tokens"] = min(usage["prompt_tokens"], tokens // step * step)
        else:
            self.prefixes.add(key)


class CallLog:
    """Each call in arrival order: request id, when it arrived (epoch ms, the mock's wall
    clock) and the status it was answered with (`timeout` for a hang, None while it runs).

    For checks about *when* calls came (tests/history: no call for a request after its
    first result). Kept only with `--log-calls`: a benchmark's millions of calls would
    make it grow without bound.
    """

    def __init__(self, clock: Any = time.time) -> None:
        self._clock = clock
        self.entries: list[dict[str, Any]] = []

    def arrived(self, request_id: str) -> dict[str, Any]:
        """Record a call as it arrives; set the returned entry's `status` once answered."""
        entry: dict[str, Any] = {"request_id": request_id, "at_ms": int(self._clock() * 1000), "status": None}
        self.entries.append(entry)
        return entry

    def of(self, request_id: str | None = None) -> list[dict[str, Any]]:
        """The entries (copies), all or one request id's."""
        return [dict(e) for e in self.entries if request_id is None or e["request_id"] == request_id]

    def clear(self) -> None:
        self.entries.clear()


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


def failure_response(
    status: int, error: dict[str, Any] | None = None, headers: dict[str, str] | None = None
) -> web.Response:
    body = {
        "error": error
        or ERROR_BODIES.get(status, {"type": "error", "code": str(status), "message": f"mock: HTTP {status}"})
    }
    return web.json_response(body, status=status, headers=headers or {})


def prompt_tokens(messages: Any) -> int:
    """Prompt tokens as a tokenizer roughly counts them: 4 characters a token, 4 a message."""
    if not isinstance(messages, list):
        return 0
    chars = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(
                len(p.get("text", "")) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
    return math.ceil(chars / 4) + 4 * len(messages)


REASONING_TOKENS = 64
"""Reasoning tokens of an answer to a request that names a `reasoning_effort` (part of completion)."""


def completion(request_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """The answer, with a usage like a provider reports (no cached tokens: see `MockState.cache`)."""
    messages = body.get("messages") or []
    prompt = str(messages[-1].get("content", "")) if messages and isinstance(messages[-1], dict) else ""
    text = f"mock answer to: {prompt[:200]}"
    reasoning = REASONING_TOKENS if body.get("reasoning_effort") else 0
    prompt_count = prompt_tokens(messages)
    completion_count = math.ceil(len(text) / 4) + reasoning
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or "mock-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": prompt_count,
            "completion_tokens": completion_count,
            "total_tokens": prompt_count + completion_count,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        },
    }


def over_limit(state: MockState, request_id: str, body: Any) -> web.Response | None:
    """A provider's 429 when the call's model is over `--limit-rpm`/`--limit-tpm`."""
    if state.limits is None or not isinstance(body, dict):
        return None
    tokens = completion(request_id, body)["usage"]["total_tokens"]
    wait = state.limits.admit(str(body.get("model") or "mock-model"), tokens)
    if wait <= 0:
        return None
    headers = {"retry-after": str(max(1, math.ceil(wait))), "retry-after-ms": str(max(1, math.ceil(wait * 1000)))}
    error = {
        "type": "rate_limit_error",
        "code": "rate_limit_exceeded",
        "message": f"mock: rate limit reached; try again in {wait * 1000:.0f} ms",
    }
    return failure_response(429, error, headers)


def planned_failure(state: MockState, request_id: str) -> Failure:
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


def outage_failure(state: MockState) -> web.Response | None:
    if state.outage_status is None:
        return None
    return failure_response(state.outage_status)


def request_share(request_id: str) -> float:
    """Where a request id falls in [0, 1): the same for every run and every process."""
    return int.from_bytes(hashlib.sha1(request_id.encode()).digest()[:8], "big") / 2**64


def request_failure(state: MockState, request_id: str) -> Failure:
    """`--fail-once` then `--fail-always`, as consecutive bands of the id's share."""
    if not (state.once or state.always) or not request_id:
        return None
    roll = request_share(request_id)
    for kind, share in state.once:
        if roll < share:
            return failure_of(kind, state) if state.calls[request_id] == 1 else None
        roll -= share
    for kind, share in state.always:
        if roll < share:
            return failure_of(kind, state)
        roll -= share
    return None


def failure_of(kind: str, state: MockState) -> Failure:
    if kind == TIMEOUT:
        return TIMEOUT
    status = int(kind)
    return failure_response(status, headers={"retry-after": str(state.retry_after)} if status == 429 else {})


def random_failure(state: MockState) -> Failure:
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
