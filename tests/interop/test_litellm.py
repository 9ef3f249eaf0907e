"""dlqapp against a real LiteLLM proxy: its error shapes, Retry-After, X-Request-ID, fallback, outage.

The short cases call the proxy with dlqapp's own OpenAI backend (plus one worker end to end);
the `interop_full` ones run workers through retries, fallback and a proxy outage.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from dlqapp.core.backend import InferenceOutput
from dlqapp.core.errors import ErrorClass, Failure, InferenceError
from dlqapp.core.requests import validate_request
from dlqapp.inference.openai import OpenAIBackend
from tests.interop.gateway import MASTER_KEY, LiteLLMProxy, config
from tests.kafka_io import (
    Record,
    keys_seen,
    produce,
    read_topic,
    request_bytes,
)
from tests.support import (
    Worker,
    unique,
    unique_ids,
    wait_until,
)


def attempt(
    proxy: LiteLLMProxy, model: str, rid: str | None = None, api_key: str = MASTER_KEY, timeout_ms: int = 10_000
) -> Failure | InferenceOutput:
    """One call through dlqapp's OpenAI backend: the output, or the classified failure."""

    async def run() -> Failure | InferenceOutput:
        backend = OpenAIBackend(proxy.api_url, api_key=api_key, timeout_ms=timeout_ms, pool_size=2, default_model="ok")
        request = validate_request(
            {"request_id": rid or unique(model), "model": model, "messages": [{"role": "user", "content": "hi"}]}
        )
        try:
            return await backend.complete(request, 1)
        except InferenceError as exc:
            return exc.failure
        finally:
            await backend.close()

    return asyncio.run(run())


def openai_worker(make_worker: Callable[..., Worker], proxy: LiteLLMProxy, **env: str) -> Worker:
    """A started worker whose openai backend is the proxy."""
    settings = {
        "DLQ_INFERENCE": "openai",
        "DLQ_INFERENCE_URL": proxy.api_url,
        "DLQ_INFERENCE_API_KEY": MASTER_KEY,
        "DLQ_INFERENCE_TIMEOUT": "5s",
        "DLQ_RETRY_DELAYS": "200ms,400ms,600ms",
        **env,
    }
    return make_worker(env_extra=settings).start()


def send(worker: Worker, model: str, *ids: str) -> None:
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid, model=model)) for rid in ids])


def outcomes(worker: Worker, ids: list[str], timeout: float = 90) -> dict[str, Record]:
    """The result or dead letter of each id."""
    records = read_topic(
        worker.bootstrap, [worker.topic("results"), worker.topic("dlq")], lambda r: set(ids) <= keys_seen(r), timeout
    )
    return {r.key.decode(): r for r in records if r.key is not None and r.key.decode() in ids}


def calls(worker: Worker, rid: str) -> int:
    return worker.get(f"/inference/calls/{rid}/")[1]["calls"]


# -- short: the proxy's answers, classified by dlqapp's backend ------------------------


@pytest.mark.parametrize(
    "model, error_class",
    [
        ("ratelimit", ErrorClass.RATE_LIMITED),
        ("internal", ErrorClass.SERVER_ERROR),
        ("ctx", ErrorClass.CONTEXT_LENGTH),
        ("filter", ErrorClass.CONTENT_FILTER),
    ],
)
def test_each_litellm_error_is_classified(litellm, model, error_class):
    failure = attempt(litellm, model)
    assert isinstance(failure, Failure), failure
    assert failure.error_class is error_class, failure.message


def test_a_missing_api_key_is_an_auth_error(litellm):
    failure = attempt(litellm, "ok", api_key="")
    assert isinstance(failure, Failure) and failure.error_class is ErrorClass.AUTH_ERROR, failure


def test_the_slow_model_times_out_below_its_latency_and_answers_above_it(litellm):
    failure = attempt(litellm, "slow", timeout_ms=300)
    assert isinstance(failure, Failure) and failure.error_class is ErrorClass.TIMEOUT, failure
    started = time.monotonic()
    output = attempt(litellm, "slow", timeout_ms=10_000)
    assert isinstance(output, InferenceOutput) and output.text == "slow hello"
    assert time.monotonic() - started >= 1.4  # mock_delay is 1.5 s


def test_x_request_id_reaches_the_provider_behind_litellm(litellm, upstream):
    rid = unique("xrid")
    output = attempt(litellm, "upstream", rid)
    assert isinstance(output, InferenceOutput) and output.text.startswith("mock answer to: hi")
    assert upstream.calls(rid) == 1  # the mock counts calls by the X-Request-ID it received


def test_the_proxy_is_the_pinned_litellm(litellm, litellm_version):
    request = urllib.request.Request(
        litellm.api_url + "/chat/completions",
        data=json.dumps({"model": "ok", "messages": [{"role": "user", "content": "hi"}]}).encode(),
        headers={"Authorization": f"Bearer {MASTER_KEY}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["x-litellm-version"] == litellm_version
        assert json.loads(response.read())["choices"][0]["message"]["content"] == "hello from litellm"


def test_a_worker_dead_letters_context_and_content_errors_by_class(make_worker, litellm):
    worker = openai_worker(make_worker, litellm)
    ctx, flt = unique("ctx"), unique("filter")
    send(worker, "ctx", ctx)
    send(worker, "filter", flt)
    found = outcomes(worker, [ctx, flt])
    for rid, error_class in ((ctx, "context_length"), (flt, "content_filter")):
        assert found[rid].topic == worker.topic("dlq") and found[rid].headers["error_class"] == error_class
        assert calls(worker, rid) == 1  # not retryable: one call


# -- full: workers through retries, Retry-After, fallback and an outage ----------------


@pytest.mark.interop_full
def test_a_worker_retries_only_what_is_worth_retrying(make_worker, litellm):
    worker = openai_worker(make_worker, litellm)
    ids = {model: unique(model) for model in ("ok", "ratelimit", "internal", "ctx", "filter")}
    for model, rid in ids.items():
        send(worker, model, rid)
    found = outcomes(worker, list(ids.values()))
    assert found[ids["ok"]].topic == worker.topic("results") and found[ids["ok"]].json["output"] == "hello from litellm"
    for model, error_class, attempts in (
        ("ratelimit", "rate_limited", 4),
        ("internal", "server_error", 4),
        ("ctx", "context_length", 1),
        ("filter", "content_filter", 1),
    ):
        record = found[ids[model]]
        assert record.topic == worker.topic("dlq") and record.headers["error_class"] == error_class, (
            model,
            record.headers,
        )
        assert calls(worker, ids[model]) == attempts, model


def _state(worker: Worker, rid: str) -> dict[str, Any] | None:
    status, body = worker.get(f"/requests/{rid}/")
    return body if status == 200 and body.get("state") in ("succeeded", "retry_scheduled") else None


def holds_for(predicate: Callable[[], bool], seconds: float, what: str) -> None:
    """Fail as soon as `predicate` stops holding within `seconds` (checking an absence needs a wait)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate(), what
        time.sleep(0.1)


@pytest.mark.interop_full
def test_litellms_forwarded_retry_after_is_honoured(make_worker, litellm):
    """The `limited` model allows one call a minute; the next get 429 + `llm_provider-retry-after: 60`."""
    worker = openai_worker(make_worker, litellm)
    ids = unique_ids("limited", 4)  # a minute boundary can let at most two of them through
    send(worker, "limited", *ids)
    states = {
        rid: wait_until(lambda rid=rid: _state(worker, rid), 60, f"{rid} to succeed or be rescheduled") for rid in ids
    }
    waiting = {rid: s for rid, s in states.items() if s["state"] == "retry_scheduled"}
    assert len(waiting) >= 2, states
    for state in waiting.values():
        assert state["error_class"] == "rate_limited"
        assert state["due"] - state["history"][-1]["at"] >= 59_000, state  # not the 200 ms tier
    holds_for(
        lambda: all(calls(worker, rid) == 1 for rid in waiting),
        3.0,
        "a rate-limited request was retried before its Retry-After",
    )


@pytest.mark.interop_full
def test_context_length_falls_back_to_the_fallback_model(make_worker, litellm):
    worker = openai_worker(make_worker, litellm, DLQ_FALLBACK_MODEL="ok")
    rid = unique("ctx-fallback")
    send(worker, "ctx", rid)
    record = outcomes(worker, [rid])[rid]
    assert record.topic == worker.topic("results"), record.headers
    result = record.json
    assert result["model"] == "ok" and result["output"] == "hello from litellm" and result["attempts"] == 2
    assert [a["error_class"] for a in result["history"]] == ["context_length", None]


@pytest.mark.interop_full
def test_the_breaker_holds_requests_through_a_litellm_outage(make_worker, litellm_env, upstream, tmp_path):
    proxy = LiteLLMProxy(litellm_env, tmp_path, config(upstream.api_url)).start()
    try:
        worker = openai_worker(
            make_worker,
            proxy,
            DLQ_BREAKER="true",
            DLQ_BREAKER_WINDOW="10s",
            DLQ_BREAKER_CONSECUTIVE="5",
            DLQ_BREAKER_MIN_CALLS="5",
            DLQ_BREAKER_OPEN="1s",
            DLQ_BREAKER_MAX_OPEN="2s",
            DLQ_INFERENCE_TIMEOUT="2s",
            DLQ_CONCURRENCY="4",
        )
        before, during = unique_ids("pre", 10), unique_ids("outage", 40)
        send(worker, "ok", *before)
        assert all(r.topic == worker.topic("results") for r in outcomes(worker, before).values())

        proxy.kill()
        send(worker, "ok", *during)
        breaker = lambda: next(iter(worker.get("/dlq/stats/")[1]["breaker"].values()))  # noqa: E731
        wait_until(lambda: breaker()["state"] in ("open", "half_open"), 60, "the breaker to open")
        proxy.start()  # same port: LiteLLM is back after its start-up time

        found = outcomes(worker, during, timeout=180)
        dead = [rid for rid, r in found.items() if r.topic == worker.topic("dlq")]
        assert dead == [], (
            f"{len(dead)} dead letters during the outage: {[found[r].headers.get('error_class') for r in dead[:5]]}"
        )
        moves = breaker()["moves"]
        for move in ("closed->open", "half_open->closed"):
            assert moves.get(move, 0) >= 1, moves
    finally:
        proxy.kill()
