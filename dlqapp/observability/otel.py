"""Tracing on: the spans of `dlqapp.observability.tracing`, made with the OpenTelemetry SDK.

Imported only when an exporter is configured. The SDK is set up as in any program that uses
it, from its own variables: the resource from OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES,
the sampler from OTEL_TRACES_SAMPLER (default: parent-based, always on), span limits from
OTEL_SPAN_*, the batch processor from OTEL_BSP_*, each exporter from its OTEL_EXPORTER_*
variables. The provider is dlqapp's own: the process-wide one (`trace.set_tracer_provider`)
is left to the program, so instrumentation loaded beside dlqapp keeps its configuration.

Trace context is read and written with the SDK's W3C propagator; a context it cannot read
starts a new trace (and `dlqapp.core.headers.trace_context` never carries a malformed one on).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib.metadata import entry_points
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, get_current_span, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from dlqapp.core.envelope import Attempt, Envelope
from dlqapp.core.headers import H_TRACESTATE, trace_context
from dlqapp.core.outcomes import DeadLetter, RetryAt, Succeeded
from dlqapp.observability import tracing
from dlqapp.observability.logs import log_event
from dlqapp.settings import Settings
from dlqapp.settings.tracing import EXPORTER_GROUP

log = logging.getLogger("dlqapp.observability.otel")

SERVICE = "dlqapp"
"""`service.name` when neither OTEL_SERVICE_NAME nor OTEL_RESOURCE_ATTRIBUTES names one."""
STATUS_CHARS = 200
"""An error span's status description: the error class and the start of its message."""

_W3C = TraceContextTextMapPropagator()


def load_exporters(names: tuple[str, ...]) -> tuple[SpanExporter, ...]:
    """One exporter per entry point name of `opentelemetry_traces_exporter`, built with no arguments."""
    found = {ep.name: ep for ep in entry_points(group=EXPORTER_GROUP)}
    return tuple(found[name].load()() for name in names)


def resource(settings: Settings) -> Resource:
    """The spans' resource: the SDK's (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME), `dlqapp` as
    the service name when those name none, and dlqapp's version."""
    from dlqapp import __version__

    attributes: dict[str, Any] = {SERVICE_VERSION: __version__}
    if settings.otel_service_name:
        attributes[SERVICE_NAME] = settings.otel_service_name
    found = Resource.create(attributes)
    if str(found.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        found = found.merge(Resource({SERVICE_NAME: SERVICE}))
    return found


def _parent(carried: Mapping[str, str]) -> Context:
    """The context a span continues: the one `carried` names, else an empty one (a new trace)."""
    return _W3C.extract(trace_context(carried))


def _carry(span: Span, lineage: dict[str, str]) -> None:
    """From now on `lineage` names `span` (and its trace state)."""
    lineage.pop(H_TRACESTATE, None)
    _W3C.inject(lineage, context=set_span_in_context(span))


class OtelTracing(tracing.Tracing):
    """Spans made by an OpenTelemetry SDK tracer provider of dlqapp's own."""

    enabled = True

    def __init__(self, provider: TracerProvider, *, default_model: str) -> None:
        from dlqapp import __version__

        self.provider = provider
        self.tracer = provider.get_tracer("dlqapp", __version__)
        self.default_model = default_model

    @classmethod
    def create(cls, settings: Settings, exporters: tuple[SpanExporter, ...]) -> OtelTracing:
        """A provider with the SDK's defaults from the environment, one batch processor per exporter."""
        provider = TracerProvider(resource=resource(settings))  # exports what is left at exit
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        log_event(
            log,
            logging.INFO,
            "tracing_on",
            exporters=",".join(settings.span_exporters) or None,
            service=provider.resource.attributes.get(SERVICE_NAME),
        )
        return cls(provider, default_model=settings.default_model)

    def attempt(self, envelope: Envelope, *, tier: str, model: str | None) -> tracing.AttemptSpan:
        return _Attempt(self, envelope, tier=tier, model=model or self.default_model)

    def start_attempt(self, envelope: Envelope, *, tier: str, model: str) -> Span:
        """The span of the envelope's next attempt, child of the context it carries, which then names it."""
        span = self.tracer.start_span(
            tracing.ATTEMPT_SPAN,
            context=_parent(envelope.lineage),
            kind=SpanKind.CONSUMER,
            attributes={
                tracing.REQUEST_ID: envelope.request_id,
                tracing.ATTEMPT: envelope.attempts + 1,
                tracing.TIER: tier,
                tracing.MODEL: model,
            },
        )
        _carry(span, envelope.lineage)
        return span

    @contextmanager
    def replay(
        self,
        dead_letter: Mapping[str, str],
        *,
        request_id: str,
        replay_count: int,
        replay_of: str,
        replayed_by: str,
        edited: bool,
        forced: bool,
        error_class: str | None,
    ) -> Iterator[dict[str, str]]:
        parent = _parent(dead_letter)
        dead = get_current_span(parent).get_span_context()
        attributes: dict[str, Any] = {
            tracing.REQUEST_ID: request_id,
            tracing.REPLAY_COUNT: replay_count,
            tracing.REPLAY_OF: replay_of,
            tracing.REPLAYED_BY: replayed_by,
            tracing.REPLAY_EDITED: edited,
            tracing.REPLAY_FORCED: forced,
        }
        if error_class:
            attributes[tracing.DEAD_LETTER_ERROR] = error_class
        span = self.tracer.start_span(
            tracing.REPLAY_SPAN,
            context=parent,
            kind=SpanKind.PRODUCER,
            attributes=attributes,
            links=[Link(dead, {tracing.LINK_KIND: "dead_letter"})] if dead.is_valid else None,
        )
        carried: dict[str, str] = {}
        _carry(span, carried)
        try:
            yield carried
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:STATUS_CHARS]))
            raise
        finally:
            span.end()

    def flush(self, timeout_s: float = 5.0) -> bool:
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self.provider.shutdown()


class _Attempt(tracing.AttemptSpan):
    """The span of one attempt (and of its fallback attempt, if one follows)."""

    __slots__ = ("_ended", "_span", "_tracing")

    def __init__(self, owner: OtelTracing, envelope: Envelope, *, tier: str, model: str) -> None:
        self._tracing = owner
        self._span = owner.start_attempt(envelope, tier=tier, model=model)
        self._ended = False

    def fall_back(self, failed: Attempt, envelope: Envelope, *, model: str) -> None:
        attributes: dict[str, Any] = {tracing.OUTCOME: "fallback"}
        self._finish(attributes, _called(failed, attributes))
        self._span.end()
        self._span = self._tracing.start_attempt(envelope, tier="fallback", model=model)

    def outcome(self, outcome: Succeeded | RetryAt | DeadLetter, attempt: Attempt | None) -> None:
        attributes: dict[str, Any] = {tracing.OUTCOME: tracing.outcome_name(outcome)}
        error = _called(attempt, attributes) if attempt is not None else None
        if isinstance(outcome, Succeeded):
            attributes[tracing.RESPONSE_MODEL] = outcome.output.model
        elif error is None:  # no call (expired), or a call that did not fail
            error_class, reason = tracing.failure_of(outcome)
            attributes[tracing.ERROR_TYPE] = error_class
            error = f"{error_class}: {reason}"
        self._finish(attributes, error)

    def _finish(self, attributes: dict[str, Any], error: str | None) -> None:
        """Set the attributes an attempt ended with (in one call: each costs the SDK a check
        and a lock), and the status error with `error` as its description."""
        self._span.set_attributes(attributes)
        if error is not None:
            self._span.set_status(Status(StatusCode.ERROR, error[:STATUS_CHARS]))

    def failed(self, exc: BaseException) -> None:
        span = self._span
        span.set_attribute(tracing.OUTCOME, "interrupted")
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:STATUS_CHARS]))

    def end(self) -> None:
        if not self._ended:
            self._ended = True
            self._span.end()


def _called(attempt: Attempt, attributes: dict[str, Any]) -> str | None:
    """What the call showed, added to `attributes`: its error class (a failure) and, for a retry,
    its lateness. Returns the error (class and message), None when the call succeeded."""
    if attempt.due_ms is not None:
        attributes[tracing.LATENESS_MS] = max(0, attempt.at - attempt.due_ms)
    if not attempt.error_class:
        return None
    attributes[tracing.ERROR_TYPE] = attempt.error_class
    return f"{attempt.error_class}: {attempt.error}"
