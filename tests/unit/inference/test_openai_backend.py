"""The openai backend against the mock server, in process: every mapping, end to end over HTTP."""

from __future__ import annotations

import asyncio
import email.utils
import random
import socket
import time

import pytest
from aiohttp.test_utils import TestServer

from dlqapp.core.errors import ErrorClass, InferenceError
from dlqapp.core.requests import validate_request
from dlqapp.devtools.mock_llm import MockState, build_app
from dlqapp.inference.openai import OpenAIBackend


def request(rid="r1", **extra):
    return validate_request({"request_id": rid, "messages": [{"role": "user", "content": "hi"}], **extra})


async def with_mock(check, timeout_ms=2000):
    state = MockState(latency_ms=0, jitter_ms=0, mix=[], retry_after=1.0, rng=random.Random(1))
    server = TestServer(build_app(state))
    await server.start_server()
    backend = OpenAIBackend(
        str(server.make_url("/v1")), api_key="sk-test", timeout_ms=timeout_ms, pool_size=8, default_model="mock-model"
    )
    try:
        await check(backend, state)
    finally:
        await backend.close()
        await server.close()


def run(check, **kwargs):
    asyncio.run(with_mock(check, **kwargs))


async def failure_of(backend, req):
    with pytest.raises(InferenceError) as info:
        await backend.complete(req, 1)
    return info.value.failure


def plan(state, rid, **spec):
    from dlqapp.devtools.mock_llm import Plan

    state.plans[rid] = Plan(remaining=spec.pop("fail_times", 1), **spec)


def test_success_returns_text_usage_and_sends_the_request_id():
    async def check(backend, state):
        out = await backend.complete(request(model="gpt-x"), 1)
        assert out.text.startswith("mock answer to: hi") and out.model == "gpt-x" and out.usage["total_tokens"] > 0
        assert state.calls["r1"] == 1  # counted by X-Request-ID

    run(check)


@pytest.mark.parametrize(
    "spec, cls",
    [
        ({"status": 500}, ErrorClass.SERVER_ERROR),
        ({"status": 503}, ErrorClass.SERVER_ERROR),
        ({"status": 529}, ErrorClass.SERVER_ERROR),
        ({"status": 408}, ErrorClass.SERVER_ERROR),
        ({"status": 409}, ErrorClass.SERVER_ERROR),
        ({"status": 429}, ErrorClass.RATE_LIMITED),
        ({"status": 429, "error": {"code": "insufficient_quota", "message": "quota"}}, ErrorClass.QUOTA_EXCEEDED),
        (
            {"status": 400, "error": {"code": "context_length_exceeded", "message": "maximum context length"}},
            ErrorClass.CONTEXT_LENGTH,
        ),
        (
            {"status": 400, "error": {"code": "content_filter", "message": "content management policy"}},
            ErrorClass.CONTENT_FILTER,
        ),
        ({"status": 401}, ErrorClass.AUTH_ERROR),
        ({"status": 403}, ErrorClass.AUTH_ERROR),
        ({"status": 404}, ErrorClass.INVALID_REQUEST),
        ({"status": 400}, ErrorClass.INVALID_REQUEST),
    ],
)
def test_error_responses_map_to_classes(spec, cls):
    async def check(backend, state):
        plan(state, "r1", **spec)
        assert (await failure_of(backend, request())).error_class is cls
        assert (await backend.complete(request(), 2)).text  # the plan is spent: the next call succeeds

    run(check)


@pytest.mark.parametrize(
    "spec, expected_ms",
    [
        ({"retry_after": 3}, 3000),
        ({"retry_after_ms": 1500}, 1500),
        ({"headers": {"retry-after": "DATE"}}, 5000),
    ],
)
def test_rate_limit_delay_header_forms(spec, expected_ms):
    async def check(backend, state):
        if spec.get("headers"):
            spec["headers"] = {"retry-after": email.utils.formatdate(time.time() + 5, usegmt=True)}
        plan(state, "r1", status=429, **spec)
        delay = (await failure_of(backend, request())).retry_after_ms
        assert expected_ms - 1500 <= delay <= expected_ms

    run(check)


def test_x_should_retry_is_obeyed():
    async def check(backend, state):
        plan(state, "r1", status=503, headers={"x-should-retry": "false"})
        assert (await failure_of(backend, request())).retryable is False

    run(check)


def test_a_hanging_provider_is_a_timeout():
    async def check(backend, state):
        plan(state, "r1", status="timeout")
        started = time.monotonic()
        assert (await failure_of(backend, request())).error_class is ErrorClass.TIMEOUT
        assert time.monotonic() - started < 5

    run(check, timeout_ms=300)


def test_a_refused_connection_is_a_connection_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the call: nothing listens there

    async def check():
        backend = OpenAIBackend(
            f"http://127.0.0.1:{port}/v1", api_key="", timeout_ms=1000, pool_size=2, default_model="m"
        )
        try:
            assert (await failure_of(backend, request())).error_class is ErrorClass.CONNECTION_ERROR
        finally:
            await backend.close()

    asyncio.run(check())


def test_outage_switch_fails_every_call():
    async def check(backend, state):
        state.outage_status = 503
        for n in range(3):
            assert (await failure_of(backend, request(f"r{n}"))).error_class is ErrorClass.SERVER_ERROR
        state.outage_status = None
        assert (await backend.complete(request("r9"), 1)).text

    run(check)


def test_the_mock_enforces_requests_per_minute_per_model_with_a_retry_after_and_counts_its_429s():
    from dlqapp.devtools.mock_llm import ProviderLimits

    async def check(backend, state):
        state.limits = ProviderLimits(rpm=120, tpm=None)  # 2 per second, a bucket of 2, full at start
        for i in range(2):
            await backend.complete(request(f"ok{i}", model="a"), 1)
        failure = await failure_of(backend, request("over", model="a"))
        assert failure.error_class is ErrorClass.RATE_LIMITED and 0 < failure.retry_after_ms <= 500
        await backend.complete(request("other", model="b"), 1)  # limits are per model
        assert state.limits.throttled == {"a": 1} and state.outcomes["429"] == 1

    run(check)


def test_the_mock_enforces_tokens_per_minute_by_the_usage_it_reports():
    from dlqapp.devtools.mock_llm import ProviderLimits

    async def check(backend, state):
        state.limits = ProviderLimits(rpm=None, tpm=600)  # 10 tokens a second, a bucket of 10
        long = [{"role": "user", "content": "word " * 30}]
        out = await backend.complete(
            request("t1", model="a", messages=long), 1
        )  # costs more than the bucket holds: goes, leaves a debt
        assert out.usage["total_tokens"] > 10
        failure = await failure_of(backend, request("t2", model="a"))
        assert failure.error_class is ErrorClass.RATE_LIMITED and failure.retry_after_ms > 0

    run(check)


def test_a_redirect_is_not_followed_and_says_where_it_points():
    from aiohttp import web

    async def check() -> None:
        async def moved(request: web.Request) -> web.Response:
            raise web.HTTPTemporaryRedirect("/v2/chat/completions")

        app = web.Application()
        app.router.add_post("/v1/chat/completions", moved)
        server = TestServer(app)
        await server.start_server()
        backend = OpenAIBackend(
            str(server.make_url("/v1")), api_key="", timeout_ms=2000, pool_size=2, default_model="m"
        )
        try:
            failure = await failure_of(backend, request())
        finally:
            await backend.close()
            await server.close()
        assert failure.error_class is ErrorClass.UNKNOWN
        assert "HTTP 307" in failure.message and "redirects to /v2/chat/completions" in failure.message
        assert "DLQ_INFERENCE_URL" in failure.message

    asyncio.run(check())


def test_a_lone_surrogate_in_a_providers_answer_is_replaced():
    """Its served model becomes a metric label: one such answer made every /metrics scrape 500."""
    body = OpenAIBackend._json(
        b'{"model": "gpt\\ud800", "choices": [{"message": {"content": "ok \\udfff \\ud83d\\ude42"}}]}'
    )
    assert body["model"] == "gpt?" and body["choices"][0]["message"]["content"] == "ok ? \U0001f642"
