"""A request on its way through the tiers: its original bytes plus what dlqapp learnt about it.

Pure code. Everything travels in headers; the payload is carried unchanged from `input`
to `results` or `dlq`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dlqapp.core import compact_json
from dlqapp.core.clock import now_ms
from dlqapp.core.headers import (
    H_ATTEMPTS,
    H_BUDGET_HELD,
    H_ERROR_CLASS,
    H_HISTORY,
    H_LAST_ERROR,
    H_ORIGINAL_TIMESTAMP,
    H_REPLAY_COUNT,
    H_REPLAY_OF,
    H_REQUEST_ID,
    H_RETRY_COUNT,
    H_SCHEDULED_TIME,
    H_SOURCE,
    H_SPENT,
    H_TENANT,
    header_int,
    header_json,
    trace_context,
)
from dlqapp.core.prices import Spent, usd
from dlqapp.core.usage import Usage

HISTORY_LIMIT = 50
_NOTHING_SPENT = Spent()


@dataclass
class Attempt:
    """One entry of a request's attempt history."""

    attempt: int
    at: int
    topic: str
    due_ms: int | None = None
    """The due time the attempt ran for (a retry); `scheduled` in the public history."""
    duration_ms: int | None = None
    error_class: str | None = None
    error: str | None = None
    usage: Usage | None = None
    """The tokens it used (the provider's report, or an estimate marked as such)."""
    cost_nusd: int | None = None
    """What it cost in nano-dollars (None: its model has no price)."""
    model: str | None = None
    """The model it called."""

    def as_dict(self) -> dict[str, Any]:
        """The history entry (what `dataclasses.asdict` gives, without its deep copy: a hot path)."""
        entry: dict[str, Any] = {
            "attempt": self.attempt,
            "at": self.at,
            "topic": self.topic,
            "scheduled": self.due_ms,
            "duration_ms": self.duration_ms,
            "error_class": self.error_class,
            "error": self.error,
        }
        if self.usage is not None:
            entry["model"] = self.model
            entry["tokens"] = self.usage.tokens()
            entry["cost_usd"] = None if self.cost_nusd is None else usd(self.cost_nusd)
            if self.usage.reasoning:
                entry["reasoning_tokens"] = self.usage.reasoning
            if self.usage.estimated:
                entry["tokens_estimated"] = True
        return entry


@dataclass
class Envelope:
    """A request in flight: its original bytes plus everything learnt about it so far.

    Serialised as Kafka headers on the tier, due and dlq topics, and as one blob in the
    parked-retry table. `attempts` counts attempts made so far; the `retry_count`
    header is the number of the retry a tier message waits for (1, 2, 3), which is the same.
    """

    request_id: str
    payload: bytes
    original_timestamp: int
    source: dict[str, Any]
    attempts: int = 0
    due_ms: int | None = None
    error_class: str | None = None
    last_error: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    lineage: dict[str, str] = field(default_factory=dict)
    """Headers carried on to every record of the request: replay lineage and trace context (`carried_on`)."""
    spent: Spent = field(default_factory=Spent)
    """Tokens and cost of every attempt so far (header `spent`; a replay carries it on)."""
    tenant: str | None = None
    """Whose request it is (header `tenant`), once the pipeline has read it."""
    held: bool = False
    """Parked over its budget, not for a retry (header `budget_held`)."""

    @property
    def replayed(self) -> bool:
        """A dead letter an operator sent back (it has failed before, whatever its attempts say)."""
        return (header_int(self.lineage, H_REPLAY_COUNT) or 0) > 0

    def record(self, attempt: Attempt) -> None:
        """Append an attempt to the history (bounded), add up what it spent, update the last error."""
        if attempt.usage is not None:
            self.spent = self.spent.plus(attempt.usage, attempt.cost_nusd)
        self.attempts = attempt.attempt
        self.error_class = attempt.error_class
        self.last_error = attempt.error
        self.history.append(attempt.as_dict())
        del self.history[:-HISTORY_LIMIT]

    def headers(self, **extra: str | int | None) -> list[tuple[str, bytes]]:
        """Kafka headers for this envelope, plus any `extra` (None values are left out)."""
        values: dict[str, Any] = {
            H_REQUEST_ID: self.request_id,
            H_RETRY_COUNT: self.attempts,
            H_ATTEMPTS: self.attempts,
            H_SCHEDULED_TIME: self.due_ms,
            H_ORIGINAL_TIMESTAMP: self.original_timestamp,
            H_ERROR_CLASS: self.error_class,
            H_LAST_ERROR: self.last_error,
            H_HISTORY: compact_json.dumps_str(self.history),
            H_SOURCE: compact_json.dumps_str(self.source),
            H_SPENT: self.spent.encode() if self.spent != _NOTHING_SPENT else None,
            H_TENANT: self.tenant,
            H_BUDGET_HELD: "true" if self.held else None,
            **self.lineage,
            **extra,
        }
        return [(k, str(v).encode()) for k, v in values.items() if v is not None]

    @classmethod
    def fresh(
        cls, request_id: str, payload: bytes, headers: Mapping[str, str], *, written_ms: int, read_from: dict[str, Any]
    ) -> Envelope:
        """A request first seen: no attempts yet; its replay lineage and `source` header
        (where it first entered dlqapp) kept, else `read_from`."""
        return cls(
            request_id=request_id,
            payload=payload,
            original_timestamp=written_ms,
            source=header_json(headers, H_SOURCE, dict) or read_from,
            lineage=carried_on(headers),
            spent=Spent.decode(headers.get(H_SPENT)),
        )

    @classmethod
    def from_headers(cls, request_id: str, payload: bytes, headers: Mapping[str, str]) -> Envelope:
        """Rebuild an envelope from parsed headers written by `headers()`.

        Never raises: a malformed value is read as absent.
        """
        h = headers
        return cls(
            request_id=request_id,
            payload=payload,
            original_timestamp=header_int(h, H_ORIGINAL_TIMESTAMP) or now_ms(),
            source=header_json(h, H_SOURCE, dict) or {},
            attempts=header_int(h, H_ATTEMPTS) or header_int(h, H_RETRY_COUNT) or 0,
            due_ms=header_int(h, H_SCHEDULED_TIME),
            error_class=h.get(H_ERROR_CLASS),
            last_error=h.get(H_LAST_ERROR),
            history=[a for a in header_json(h, H_HISTORY, list) or [] if isinstance(a, dict)],
            lineage=carried_on(h),
            spent=Spent.decode(h.get(H_SPENT)),
            tenant=h.get(H_TENANT) or None,
            held=h.get(H_BUDGET_HELD) == "true",
        )

    def to_bytes(self) -> bytes:
        """One blob for the parked-retry table: JSON headers, a newline, the payload."""
        meta = {k: v for k, v in self.headers()}
        return compact_json.dumps({k: v.decode() for k, v in meta.items()}) + b"\n" + self.payload

    @classmethod
    def from_bytes(cls, blob: bytes) -> Envelope:
        meta_raw, _, payload = blob.partition(b"\n")
        meta = compact_json.loads(meta_raw)
        return cls.from_headers(meta[H_REQUEST_ID], payload, meta)


def lineage_of(headers: Mapping[str, str]) -> dict[str, str]:
    """The replay lineage headers a request carries on (`replay_of`, `replay_count`)."""
    lineage = {H_REPLAY_OF: headers[H_REPLAY_OF][:200]} if H_REPLAY_OF in headers else {}
    replay_count = header_int(headers, H_REPLAY_COUNT)
    if replay_count is not None:
        lineage[H_REPLAY_COUNT] = str(replay_count)
    return lineage


def carried_on(headers: Mapping[str, str]) -> dict[str, str]:
    """What a request carries on to every record written for it (`Envelope.lineage`): its
    replay lineage and its W3C trace context (`traceparent`, `tracestate`; a malformed one
    is left behind)."""
    return {**lineage_of(headers), **trace_context(headers)}


@dataclass
class Result:
    """A successful inference, published on `results` keyed by request id."""

    request_id: str
    model: str
    output: str
    attempts: int
    latency_ms: int
    completed_at: int
    metadata: dict[str, Any]
    usage: dict[str, Any] | None = None
    history: list[dict[str, Any]] | None = None
    output_bytes: int | None = None
    spent: Spent | None = None
    """Tokens and cost of every attempt of the request (`tokens`, `cost_usd`)."""
    tenant: str | None = None
    """Set when the output was cut to fit the results topic: its whole size in bytes."""

    def to_bytes(self) -> bytes:
        """The JSON published on `results` (fields in declaration order, like `dataclasses.asdict`;
        built by hand: asdict deep-copies metadata and history on every result)."""
        doc = {
            "request_id": self.request_id,
            "model": self.model,
            "output": self.output,
            "attempts": self.attempts,
            "latency_ms": self.latency_ms,
            "completed_at": self.completed_at,
            "metadata": self.metadata,
            "usage": self.usage,
            "history": self.history,
        }
        if self.spent is not None:
            doc.update(self.spent.public())
        if self.tenant is not None:
            doc["tenant"] = self.tenant
        if self.output_bytes is not None:
            doc["output_truncated"] = True
            doc["output_bytes"] = self.output_bytes
        return compact_json.dumps(doc)
