"""Traces: one span per attempt and one per operator replay, in the trace of the request.

A request's W3C trace context (`traceparent`, `tracestate`) travels in `Envelope.lineage`
(`dlqapp.core.envelope.carried_on`) to every record written for it: tier messages, the
parked retry, results, dead letters, a forward to the owning partition, a replay. With
tracing on, each attempt is a span whose parent is the context the request carries, and
the context carried on from then names that span: the next attempt (after a retry, a
restart, a replay) is its child, and a consumer of `results` or `dlq` finds the attempt
that wrote the record. A request without a context (or with a malformed one) starts a
trace of its own.

`Tracing` itself is tracing off: no spans, the context carried on unchanged, and the
request path pays a few calls of empty methods. `dlqapp.observability.otel.OtelTracing`
makes the spans with the OpenTelemetry SDK; the composition root imports it only when an
exporter is configured, so a worker without one never loads the SDK.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from dlqapp.core.envelope import Attempt, Envelope
from dlqapp.core.headers import trace_context
from dlqapp.core.outcomes import DeadLetter, RetryAt, Succeeded

ATTEMPT_SPAN = "dlqapp.attempt"
REPLAY_SPAN = "dlqapp.replay"

REQUEST_ID = "dlqapp.request_id"
ATTEMPT = "dlqapp.attempt"
"""The attempt's number (1 for the first call, as in the history)."""
TIER = "dlqapp.tier"
"""Where the attempt came from: `input`, a tier's label (`retry-1s`), or `fallback`."""
MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
ERROR_TYPE = "error.type"
"""The attempt's error class (`server_error`, `expired`, ...), absent on a success."""
LATENESS_MS = "dlqapp.lateness_ms"
"""A retry's start after its due time (ms)."""
OUTCOME = "dlqapp.outcome"
"""`succeeded`, `retry_scheduled`, `dead_lettered`, `fallback` (a fallback attempt follows), or
`interrupted` (the attempt ended without an outcome: handed back, stopped, failed)."""
REPLAY_COUNT = "dlqapp.replay_count"
REPLAY_OF = "dlqapp.replay_of"
"""`partition:offset` of the dead letter replayed."""
REPLAYED_BY = "dlqapp.replayed_by"
REPLAY_EDITED = "dlqapp.replay.edited"
REPLAY_FORCED = "dlqapp.replay.forced"
DEAD_LETTER_ERROR = "dlqapp.dead_letter.error_class"
LINK_KIND = "dlqapp.link"
"""On a replay span's link: `dead_letter` (the span that dead-lettered the request)."""


def outcome_name(outcome: Succeeded | RetryAt | DeadLetter) -> str:
    """The `dlqapp.outcome` of an attempt that ended in `outcome` (the request's state names)."""
    if isinstance(outcome, Succeeded):
        return "succeeded"
    return "retry_scheduled" if isinstance(outcome, RetryAt) else "dead_lettered"


def failure_of(outcome: RetryAt | DeadLetter) -> tuple[str, str]:
    """The error class and message of an outcome that is not a success."""
    if isinstance(outcome, RetryAt):
        return outcome.failure.error_class.value, outcome.failure.message
    return outcome.error_class.value, outcome.reason


class AttemptSpan:
    """One attempt's span; this one records nothing (tracing off)."""

    __slots__ = ()

    def fall_back(self, failed: Attempt, envelope: Envelope, *, model: str) -> None:
        """`failed` is followed by a fallback attempt on `model`: end this attempt's span and
        begin the fallback's, its child."""

    def outcome(self, outcome: Succeeded | RetryAt | DeadLetter, attempt: Attempt | None) -> None:
        """The outcome about to be carried out, and the call that led to it (None: no call)."""

    def failed(self, exc: BaseException) -> None:
        """The attempt ended by an exception before its outcome was carried out."""

    def end(self) -> None:
        """The attempt is over (its outcome carried out, or it failed)."""


NO_SPAN = AttemptSpan()


class Tracing:
    """Tracing off: no spans; a request's trace context is carried on as it came."""

    enabled = False

    def attempt(self, envelope: Envelope, *, tier: str, model: str | None) -> AttemptSpan:
        """The span of the envelope's next attempt, begun now, the envelope's trace context
        then naming it (`tier`: `input`, the tier's label or `fallback`)."""
        return NO_SPAN

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
        """The span of an operator's replay of the dead letter whose headers are `dead_letter`,
        while its record is written; gives the trace context to write on that record (tracing
        off: the dead letter's own)."""
        yield trace_context(dead_letter)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Export what has ended so far; False when that did not finish in time."""
        return True

    def shutdown(self) -> None:
        """Export what is left and stop the exporters (the worker is stopping)."""
