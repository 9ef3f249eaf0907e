"""Traces over in-memory fakes, read back with the OpenTelemetry SDK's in-memory exporter: one
span per attempt and per replay, all in the request's trace, its context on every record."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from dlqapp.core.envelope import Envelope
from dlqapp.core.errors import ErrorClass
from dlqapp.core.record import Record
from dlqapp.deadletters.entries import DeadLetterEntry
from dlqapp.settings import Settings
from dlqapp.wiring.composition import tracing_of
from dlqapp.wiring.ports import span_exporters
from tests.schemas import assert_valid
from tests.unit.fakes import FakeMessage, ScriptedBackend, consumed, request, worker

ROOT = Path(__file__).resolve().parents[3]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def run(coro):
    return asyncio.run(coro)


def traced(tmp_path, backend=None, **env):
    exporter = InMemorySpanExporter()
    return worker(tmp_path, backend, span_exporters=(exporter,), **env), exporter


def spans(w, exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    assert w.components.tracing.flush()
    return sorted(exporter.get_finished_spans(), key=lambda s: s.start_time or 0)


def input_record(request_id: str, headers: dict[str, str] | None = None, offset: int = 0, **body) -> Record:
    return consumed(
        request_id.encode(),
        request(request_id, **body),
        {k: v.encode() for k, v in (headers or {}).items()},
        FakeMessage("input", 0, offset),
    )


def hex_ids(span: ReadableSpan) -> tuple[str, str]:
    context = span.get_span_context()
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def traceparent_of(span: ReadableSpan) -> str:
    trace_id, span_id = hex_ids(span)
    return f"00-{trace_id}-{span_id}-{span.get_span_context().trace_flags:02x}"


def parent_of(span: ReadableSpan) -> str | None:
    return None if span.parent is None else f"{span.parent.span_id:016x}"


def run_due_retry(w) -> None:
    key = next(iter(w.parked_table))
    w.clock.now += 1000
    run(w.scheduler.on_due(consumed(key[8:], key, message=FakeMessage("due"))))


def test_a_request_failing_once_then_succeeding_is_one_trace_of_two_attempt_spans(tmp_path):
    w, exporter = traced(tmp_path, ScriptedBackend({"r1": 1}))
    run(w.pipeline.on_input(input_record("r1", {"traceparent": TRACEPARENT, "tracestate": "vendor=abc"}), w.input))
    ((_, _, tier_headers, _),) = w.tiers[0].sent
    parked_blob = next(iter(w.parked_table.values()))
    run_due_retry(w)

    first, second = spans(w, exporter)
    assert [s.name for s in (first, second)] == ["dlqapp.attempt", "dlqapp.attempt"]
    assert hex_ids(first)[0] == hex_ids(second)[0] == TRACE_ID  # the input's trace, continued
    assert parent_of(first) == PARENT_ID and parent_of(second) == hex_ids(first)[1]
    assert first.kind is SpanKind.CONSUMER and first.parent is not None and first.parent.is_remote
    assert dict(first.attributes) == {
        "dlqapp.request_id": "r1",
        "dlqapp.attempt": 1,
        "dlqapp.tier": "input",
        "gen_ai.request.model": "sim-small",
        "dlqapp.outcome": "retry_scheduled",
        "error.type": "server_error",
    }
    assert first.status.status_code is StatusCode.ERROR and "server_error" in first.status.description
    assert dict(second.attributes) == {
        "dlqapp.request_id": "r1",
        "dlqapp.attempt": 2,
        "dlqapp.tier": "retry-1s",
        "gen_ai.request.model": "sim-small",
        "dlqapp.lateness_ms": 0,
        "dlqapp.outcome": "succeeded",
        "gen_ai.response.model": "m",
    }
    assert second.status.status_code is StatusCode.UNSET

    # every record carries the context of the attempt that wrote it, the vendors' state kept
    assert tier_headers["traceparent"] == traceparent_of(first) and tier_headers["tracestate"] == "vendor=abc"
    assert Envelope.from_bytes(parked_blob).lineage["traceparent"] == traceparent_of(first)  # a restart continues
    ((_, value, result_headers, _),) = w.results.sent
    assert result_headers["traceparent"] == traceparent_of(second) and result_headers["tracestate"] == "vendor=abc"
    assert_valid("result", json.loads(value))


def test_a_request_without_a_trace_context_starts_its_own_trace(tmp_path):
    w, exporter = traced(tmp_path, ScriptedBackend({"r2": 1}))
    run(w.pipeline.on_input(input_record("r2"), w.input))
    run_due_retry(w)
    first, second = spans(w, exporter)
    assert first.parent is None and parent_of(second) == hex_ids(first)[1]
    assert hex_ids(first)[0] == hex_ids(second)[0]
    assert w.tiers[0].sent[0][2]["traceparent"] == traceparent_of(first)
    assert w.results.sent[0][2]["traceparent"] == traceparent_of(second)
    assert "tracestate" not in w.results.sent[0][2]


@pytest.mark.parametrize(
    "malformed",
    [
        "not a traceparent",
        f"00-{TRACE_ID.upper()}-{PARENT_ID}-01",
        f"00-{'0' * 32}-{PARENT_ID}-01",
        f"00-{TRACE_ID}-{'0' * 16}-01",
        f"ff-{TRACE_ID}-{PARENT_ID}-01",
        f"00-{TRACE_ID}-{PARENT_ID}-01-extra",
        "",
    ],
)
def test_a_malformed_traceparent_is_ignored_and_a_new_trace_started(tmp_path, malformed):
    w, exporter = traced(tmp_path)
    run(w.pipeline.on_input(input_record("r3", {"traceparent": malformed, "tracestate": "vendor=abc"}), w.input))
    (span,) = spans(w, exporter)
    assert span.parent is None and hex_ids(span)[0] != TRACE_ID
    ((_, _, headers, _),) = w.results.sent
    assert headers["traceparent"] == traceparent_of(span) and "tracestate" not in headers


def test_a_dead_letter_carries_its_trace_and_a_replay_continues_it_with_a_link(tmp_path):
    w, exporter = traced(tmp_path, ScriptedBackend({"r4": 1}, error=ErrorClass.AUTH_ERROR))
    run(w.pipeline.on_input(input_record("r4", {"traceparent": TRACEPARENT}), w.input))
    ((key, value, dlq_headers, partition),) = w.dlq.sent
    run(
        w.recorder.on_message(
            consumed(key, value, {k: v.encode() for k, v in dlq_headers.items()}, FakeMessage("dlq", partition, 7))
        )
    )
    entry = DeadLetterEntry.decode(w.dead_letters_table[b"r4"])
    assert_valid("dead-letter", entry.as_dict())
    answer = run(w.operator.execute({"action": "replay", "request_id": "r4", "actor": "ops"}))
    assert answer["status"] == "reprocessed"
    ((_, replayed, replay_headers, _),) = w.input.sent
    run(w.pipeline.on_input(consumed(b"r4", replayed, {k: v.encode() for k, v in replay_headers.items()}), w.input))

    failed, replay, again = spans(w, exporter)
    assert dlq_headers["traceparent"] == traceparent_of(failed)
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["dlqapp.outcome"] == "dead_lettered" and failed.attributes["error.type"] == "auth_error"
    assert replay.name == "dlqapp.replay" and replay.kind is SpanKind.PRODUCER
    assert {hex_ids(s)[0] for s in (failed, replay, again)} == {TRACE_ID}  # one trace, replay included
    assert parent_of(replay) == hex_ids(failed)[1] and parent_of(again) == hex_ids(replay)[1]
    (link,) = replay.links
    assert f"{link.context.span_id:016x}" == hex_ids(failed)[1] and dict(link.attributes) == {
        "dlqapp.link": "dead_letter"
    }
    assert dict(replay.attributes) == {
        "dlqapp.request_id": "r4",
        "dlqapp.replay_count": 1,
        "dlqapp.replay_of": "0:7",
        "dlqapp.replayed_by": "ops",
        "dlqapp.replay.edited": False,
        "dlqapp.replay.forced": False,
        "dlqapp.dead_letter.error_class": "auth_error",
    }
    assert replay_headers["traceparent"] == traceparent_of(replay) and replay_headers["replay_count"] == "1"
    assert again.attributes["dlqapp.attempt"] == 1 and again.attributes["dlqapp.outcome"] == "succeeded"
    assert w.results.sent[0][2]["traceparent"] == traceparent_of(again)


def test_a_fallback_attempt_is_a_span_of_its_own(tmp_path):
    backend = ScriptedBackend({"r5": 1}, error=ErrorClass.CONTEXT_LENGTH)
    w, exporter = traced(tmp_path, backend, DLQ_FALLBACK_MODEL="big-model")
    run(w.pipeline.on_input(input_record("r5", model="small-model"), w.input))
    primary, fallback = spans(w, exporter)
    assert primary.attributes["dlqapp.outcome"] == "fallback" and primary.attributes["error.type"] == "context_length"
    assert primary.attributes["gen_ai.request.model"] == "small-model"
    assert parent_of(fallback) == hex_ids(primary)[1]
    assert fallback.attributes["dlqapp.attempt"] == 2 and fallback.attributes["dlqapp.tier"] == "fallback"
    assert fallback.attributes["gen_ai.request.model"] == "big-model"
    assert fallback.attributes["dlqapp.outcome"] == "succeeded"
    assert w.results.sent[0][2]["traceparent"] == traceparent_of(fallback)


def test_an_expired_request_is_a_span_without_a_call(tmp_path):
    w, exporter = traced(tmp_path)
    run(w.pipeline.on_input(input_record("r6", {"traceparent": TRACEPARENT}, deadline=1), w.input))
    (span,) = spans(w, exporter)
    assert span.attributes["error.type"] == "expired" and span.attributes["dlqapp.outcome"] == "dead_lettered"
    assert span.status.status_code is StatusCode.ERROR and w.backend.calls_for("r6") == 0
    assert w.dlq.sent[0][2]["traceparent"] == traceparent_of(span)


def test_an_attempt_ended_by_an_exception_is_an_error_span(tmp_path):
    w, exporter = traced(tmp_path)

    async def broken(*args, **kwargs):
        raise RuntimeError("the broker refused it")

    w.components.pipeline.results.publish = broken
    with pytest.raises(RuntimeError):
        run(w.pipeline.on_input(input_record("r7"), w.input))
    (span,) = spans(w, exporter)
    assert span.attributes["dlqapp.outcome"] == "interrupted" and span.status.status_code is StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]


def test_a_forward_to_the_owning_partition_keeps_the_trace_context(tmp_path):
    w, _ = traced(tmp_path, DLQ_PARTITIONS="4")
    rid = next(f"r{i}" for i in range(100) if w.store.owner(f"r{i}") != 0)
    run(w.pipeline.on_input(input_record(rid, {"traceparent": TRACEPARENT}), w.input))
    ((_, _, headers, partition),) = w.input.sent
    assert partition == w.store.owner(rid) and headers["traceparent"] == TRACEPARENT


def test_tracing_off_carries_a_context_on_unchanged_and_adds_none(tmp_path):
    w = worker(tmp_path, ScriptedBackend({"r8": 1, "r9": 1}))
    assert not w.components.tracing.enabled
    context = {"traceparent": TRACEPARENT, "tracestate": "vendor=abc"}
    run(w.pipeline.on_input(input_record("r8", context), w.input))
    run(w.pipeline.on_input(input_record("r9", offset=1), w.input))
    for _ in range(2):
        run_due_retry(w)
    by_key = {key.decode(): headers for key, _, headers, _ in w.tiers[0].sent}
    assert {k: by_key["r8"][k] for k in context} == context and "traceparent" not in by_key["r9"]
    results = {key.decode(): headers for key, _, headers, _ in w.results.sent}
    assert {k: results["r8"][k] for k in context} == context
    assert "traceparent" not in results["r9"] and "tracestate" not in results["r9"]


def test_tracing_is_off_unless_an_exporter_is_configured(monkeypatch):
    assert span_exporters(Settings.from_env({})) == ()
    assert not tracing_of(Settings.from_env({}), ()).enabled
    assert span_exporters(Settings.from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})) == ()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector.example:4318")
    otlp, console = span_exporters(Settings.from_env({"OTEL_TRACES_EXPORTER": "otlp,console"}))
    assert type(otlp).__module__.startswith("opentelemetry.exporter.otlp.proto.http")
    assert otlp._endpoint == "http://collector.example:4318/v1/traces"  # the SDK read its own variable
    assert type(console).__name__ == "ConsoleSpanExporter"


def test_the_service_name_is_the_configured_one_else_dlqapp(monkeypatch):
    from dlqapp.observability.otel import resource

    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert resource(Settings.from_env({})).attributes["service.name"] == "dlqapp"
    assert resource(Settings.from_env({"OTEL_SERVICE_NAME": "llm-queue"})).attributes["service.name"] == "llm-queue"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes,deployment.environment=prod")
    found = resource(Settings.from_env({})).attributes
    assert found["service.name"] == "from-attributes" and found["deployment.environment"] == "prod"


def test_tracing_off_never_loads_the_sdk(tmp_path):
    code = (
        "import sys; from dlqapp.wiring.composition import build_app; build_app(); "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(DLQ_DATA_DIR=str(tmp_path / "data"), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
