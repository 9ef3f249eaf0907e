"""Traces from a real worker on a real Kafka to a real OTLP/HTTP endpoint: one span per attempt
and per replay, all in the input's trace, and the trace context on the records the worker
writes. A worker without OTEL_TRACES_EXPORTER carries a context on and adds none."""

from __future__ import annotations

import uuid

import pytest

from tests.kafka_io import Record, produce, read_topic, request_bytes
from tests.otlp_sink import OtlpSink, ReceivedSpan
from tests.schemas import assert_valid
from tests.support import http_json, unique, wait_until

KIND_CONSUMER, KIND_PRODUCER = 5, 4
"""OTLP's span kinds (opentelemetry.proto.trace.v1.Span.SpanKind)."""
STATUS_UNSET, STATUS_ERROR = 0, 2
SERVICE = "dlqapp-traces-test"


def a_traceparent() -> tuple[str, str, str]:
    """A fresh sampled W3C traceparent: (header, trace id, parent span id)."""
    trace_id, parent = uuid.uuid4().hex, "00f067aa0ba902b7"
    return f"00-{trace_id}-{parent}-01", trace_id, parent


@pytest.fixture(scope="module")
def sink():
    sink = OtlpSink().start()
    yield sink
    sink.stop()


def tracing_env(sink: OtlpSink, **env: str) -> dict[str, str]:
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": SERVICE,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "DLQ_SIMULATED_SUCCESS_RATE": "1.0",
        **env,
    }


@pytest.fixture(scope="module")
def traced(start_worker, sink):
    return start_worker(**tracing_env(sink, DLQ_RETRY_DELAYS="300ms,600ms,900ms"))


@pytest.fixture(scope="module")
def untraced(start_worker):
    return start_worker(OTEL_TRACES_EXPORTER="none", DLQ_SIMULATED_SUCCESS_RATE="1.0")


def send(worker, rid: str, headers: dict[str, str] | None = None, **body) -> None:
    pairs = [(k, v.encode()) for k, v in (headers or {}).items()]
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid, **body))], headers=pairs)


def outcome(worker, topic: str, rid: str, count: int = 1) -> list[Record]:
    """The first `count` records for `rid` on `topic` (non-null values)."""
    records = read_topic(
        worker.bootstrap,
        worker.topic(topic),
        lambda rs: sum(1 for r in rs if r.key == rid.encode() and r.value is not None) >= count,
        60,
    )
    return [r for r in records if r.key == rid.encode() and r.value is not None][:count]


def spans_of(sink: OtlpSink, rid: str, count: int) -> list[ReceivedSpan]:
    return wait_until(
        lambda: len(found := sink.of_request(rid)) >= count and found,
        30,
        lambda: f"{count} spans of {rid} (received: {[(s.name, s.attributes) for s in sink.of_request(rid)]})",
    )


def fails(times: int, error: str) -> dict:
    return {"metadata": {"simulate": {"fail_times": times, "error": error}}}


def test_a_retry_continues_the_inputs_trace_and_the_result_names_the_last_attempt(traced, sink):
    rid = unique("retried")
    traceparent, trace_id, parent = a_traceparent()
    send(traced, rid, {"traceparent": traceparent, "tracestate": "vendor=abc"}, **fails(1, "server_error"))
    (result,) = outcome(traced, "results", rid)
    (tier_message,) = outcome(traced, "retry-300ms", rid)
    first, second = spans_of(sink, rid, 2)

    assert {first.trace_id, second.trace_id} == {trace_id}
    assert first.parent_span_id == parent and second.parent_span_id == first.span_id
    assert first.name == second.name == "dlqapp.attempt" and first.kind == KIND_CONSUMER
    assert first.attributes["dlqapp.attempt"] == 1 and second.attributes["dlqapp.attempt"] == 2
    assert first.attributes["dlqapp.tier"] == "input" and second.attributes["dlqapp.tier"] == "retry-300ms"
    assert first.attributes["error.type"] == "server_error" and first.status_code == STATUS_ERROR
    assert first.attributes["dlqapp.outcome"] == "retry_scheduled"
    assert second.attributes["dlqapp.outcome"] == "succeeded" and second.status_code == STATUS_UNSET
    assert "error.type" not in second.attributes and second.attributes["dlqapp.lateness_ms"] >= 0
    assert first.attributes["gen_ai.request.model"] == "sim-small"
    assert first.resource["service.name"] == SERVICE

    assert tier_message.headers["traceparent"].startswith(first.traceparent_prefix)
    assert result.headers["traceparent"].startswith(second.traceparent_prefix)
    assert result.headers["tracestate"] == "vendor=abc"
    assert_valid("result", result.json)


def test_a_replay_is_a_span_linked_to_the_dead_letter_in_the_same_trace(traced, sink):
    rid = unique("replayed")
    traceparent, trace_id, _ = a_traceparent()
    send(traced, rid, {"traceparent": traceparent}, **fails(1, "auth_error"))
    entry = wait_until(lambda: (a := traced.get(f"/dlq/{rid}/"))[0] == 200 and a[1], 30, f"{rid} in the DLQ")
    (dead,) = spans_of(sink, rid, 1)
    assert dead.trace_id == trace_id and dead.attributes["dlqapp.outcome"] == "dead_lettered"
    assert dead.status_code == STATUS_ERROR and dead.attributes["error.type"] == "auth_error"
    assert entry["headers"]["traceparent"].startswith(dead.traceparent_prefix)
    assert_valid("dead-letter", entry)
    (dlq_record,) = outcome(traced, "dlq", rid)
    assert dlq_record.headers["traceparent"] == entry["headers"]["traceparent"]

    status, answer = http_json(f"{traced.url}/dlq/{rid}/reprocess/", "POST", {})
    assert status == 200 and answer["status"] == "reprocessed", answer
    (result,) = outcome(traced, "results", rid)
    _, replay, again = spans_of(sink, rid, 3)

    assert replay.name == "dlqapp.replay" and replay.kind == KIND_PRODUCER
    assert {replay.trace_id, again.trace_id} == {trace_id}  # one trace, the replay included
    assert replay.parent_span_id == dead.span_id and again.parent_span_id == replay.span_id
    assert replay.links == [(trace_id, dead.span_id, {"dlqapp.link": "dead_letter"})]
    assert replay.attributes["dlqapp.replay_count"] == 1 and replay.attributes["dlqapp.replayed_by"].startswith("api")
    assert again.attributes["dlqapp.outcome"] == "succeeded" and again.attributes["dlqapp.attempt"] == 1
    assert result.headers["traceparent"].startswith(again.traceparent_prefix)
    assert result.headers["replay_count"] == "1"


@pytest.mark.parametrize("headers", [{}, {"traceparent": "00-not-a-trace-01"}])
def test_a_request_without_a_valid_context_starts_a_trace_of_its_own(traced, sink, headers):
    rid = unique("fresh")
    send(traced, rid, headers)
    (result,) = outcome(traced, "results", rid)
    (span,) = spans_of(sink, rid, 1)
    assert span.parent_span_id == "" and result.headers["traceparent"].startswith(span.traceparent_prefix)
    assert traced.get("/livez")[0] == 200


def test_without_an_exporter_a_context_is_carried_on_and_none_is_added(untraced, sink):
    traceparent, _, _ = a_traceparent()
    with_context, without = unique("carried"), unique("plain")
    send(untraced, with_context, {"traceparent": traceparent, "tracestate": "vendor=abc"})
    send(untraced, without)
    (carried,) = outcome(untraced, "results", with_context)
    (plain,) = outcome(untraced, "results", without)
    assert carried.headers["traceparent"] == traceparent and carried.headers["tracestate"] == "vendor=abc"
    assert "traceparent" not in plain.headers and "tracestate" not in plain.headers
    assert_valid("result", plain.json)
    assert sink.of_request(with_context) == [] and sink.of_request(without) == []


def test_a_retry_parked_before_a_kill_continues_the_trace_on_the_next_worker(make_worker, sink):
    env = tracing_env(sink, DLQ_RETRY_DELAYS="8s,9s,10s")
    first = make_worker(env_extra=env).start()
    rid = unique("restarted")
    traceparent, trace_id, parent = a_traceparent()
    send(first, rid, {"traceparent": traceparent}, **fails(1, "timeout"))
    wait_until(lambda: first.get(f"/requests/{rid}/")[1].get("state") == "retry_scheduled", 30, f"{rid} parked")
    outcome(first, "retry-8s", rid)  # committed (read_committed), so the next worker finds it parked
    (before,) = spans_of(sink, rid, 1)  # exported before the kill
    first.kill()
    second = make_worker(env_extra=env, app_id=first.app_id, prefix=first.prefix).start()
    (result,) = outcome(second, "results", rid)
    _, after = spans_of(sink, rid, 2)
    assert {before.trace_id, after.trace_id} == {trace_id} and before.parent_span_id == parent
    assert after.parent_span_id == before.span_id and after.attributes["dlqapp.attempt"] == 2
    assert result.headers["traceparent"].startswith(after.traceparent_prefix)
