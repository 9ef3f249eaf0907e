"""dlqapp with the openai backend against dlqapp-mock-llm: mappings, fallback, one call per success."""

from __future__ import annotations

import json

import pytest

from tests.kafka_io import (
    keys_seen,
    produce,
    read_topic,
    request_bytes,
)
from tests.support import MockLLM, unique


@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    m = MockLLM(tmp_path_factory.mktemp("mock"), args=["--latency-ms", "5"]).start()
    yield m
    m.stop()


@pytest.fixture(scope="module")
def worker(mock, start_worker):
    return start_worker(
        DLQ_INFERENCE="openai",
        DLQ_INFERENCE_URL=mock.api_url,
        DLQ_INFERENCE_TIMEOUT="1s",
        DLQ_RETRY_DELAYS="200ms,400ms,600ms",
        DLQ_FALLBACK_MODEL="fallback-model",
    )


def send(worker, *ids, **extra):
    produce(
        worker.bootstrap,
        worker.topic("input"),
        [(rid.encode(), request_bytes(rid, model="main-model", **extra)) for rid in ids],
    )


def outcome(worker, rid, timeout=60):
    topics = [worker.topic("results"), worker.topic("dlq")]
    records = read_topic(worker.bootstrap, topics, lambda r: rid in keys_seen(r), timeout)
    (record,) = [r for r in records if r.key.decode() == rid]
    return record


def test_one_call_per_successful_request(worker, mock):
    ids = [unique("ok") for _ in range(10)]
    send(worker, *ids)
    for rid in ids:
        body = outcome(worker, rid).json
        assert (
            body["output"].startswith("mock answer to:")
            and body["model"] == "main-model"
            and body["usage"]["total_tokens"] > 0
        )
        assert mock.calls(rid) == 1


def test_server_errors_are_retried_through_the_tiers(worker, mock):
    rid = unique("503")
    mock.plan(request_id=rid, fail_times=2, status=503)
    send(worker, rid)
    body = outcome(worker, rid).json
    assert body["attempts"] == 3 and mock.calls(rid) == 3
    assert [a["error_class"] for a in body["history"]] == ["server_error", "server_error", None]


def test_rate_limit_retry_after_is_honoured(worker, mock):
    rid = unique("429")
    mock.plan(request_id=rid, fail_times=1, status=429, retry_after=2)
    send(worker, rid)
    first, second = outcome(worker, rid).json["history"]
    assert first["error_class"] == "rate_limited"
    assert second["at"] >= second["scheduled"] >= first["at"] + 2000


@pytest.mark.parametrize(
    "spec, error_class",
    [
        (
            {"status": 429, "error": {"code": "insufficient_quota", "message": "You exceeded your current quota"}},
            "quota_exceeded",
        ),
        (
            {"status": 400, "error": {"code": "content_filter", "message": "content management policy"}},
            "content_filter",
        ),
        ({"status": 401}, "auth_error"),
        ({"status": 404, "error": {"code": "model_not_found", "message": "no such model"}}, "invalid_request"),
        ({"status": 503, "headers": {"x-should-retry": "false"}}, "server_error"),
    ],
)
def test_non_retryable_responses_reach_the_dlq_after_one_call(worker, mock, spec, error_class):
    rid = unique(error_class)
    mock.plan(request_id=rid, fail_times=1, **spec)
    send(worker, rid)
    record = outcome(worker, rid)
    assert record.topic == worker.topic("dlq") and record.headers["error_class"] == error_class
    assert mock.calls(rid) == 1


def test_a_timeout_is_retried(worker, mock):
    rid = unique("hang")
    mock.plan(request_id=rid, fail_times=1, status="timeout")
    send(worker, rid)
    body = outcome(worker, rid).json
    assert body["history"][0]["error_class"] == "timeout" and body["attempts"] == 2


def test_context_length_goes_straight_to_the_fallback_model(worker, mock):
    rid = unique("long")
    mock.plan(
        request_id=rid,
        fail_times=1,
        status=400,
        error={"code": "context_length_exceeded", "message": "maximum context length is 8192 tokens"},
    )
    send(worker, rid)
    body = outcome(worker, rid).json
    assert body["model"] == "fallback-model" and body["attempts"] == 2
    assert [a["topic"] for a in body["history"]] == [worker.topic("input"), "fallback:fallback-model"]


def test_a_request_that_always_fails_on_its_model_succeeds_on_the_fallback(worker, mock):
    rid = unique("fallback")
    mock.plan(request_id=rid, fail_times=4, status=500)
    send(worker, rid)
    body = outcome(worker, rid).json
    assert body["model"] == "fallback-model" and body["attempts"] == 5 and mock.calls(rid) == 5
    assert body["history"][-1]["topic"] == "fallback:fallback-model"


def test_when_the_fallback_fails_too_the_dlq_says_so(worker, mock):
    rid = unique("both-fail")
    mock.plan(request_id=rid, fail_times=5, status=500)
    send(worker, rid)
    record = outcome(worker, rid)
    assert record.topic == worker.topic("dlq") and "fallback model fallback-model" in record.headers["final_error"]
    assert len(json.loads(record.headers["attempt_history"])) == 5
