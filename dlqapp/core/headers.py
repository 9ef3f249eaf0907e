"""Kafka header names dlqapp reads and writes (the public contract), and one tolerant way to read them.

Every header value is read through `header_dict`, `header_int` and `header_json`: a
malformed value is read as absent, never raised.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from dlqapp.core import compact_json

H_RETRY_COUNT = "retry_count"
H_ATTEMPTS = "attempts"
H_SCHEDULED_TIME = "scheduled_time"
H_ORIGINAL_TIMESTAMP = "original_timestamp"
H_ERROR_CLASS = "error_class"
H_LAST_ERROR = "last_error"
H_FINAL_ERROR = "final_error"
H_HISTORY = "attempt_history"
H_REQUEST_ID = "request_id"
H_SOURCE = "source"
H_DEAD_AT = "dead_at"
H_REPLAY_OF = "replay_of"
H_REPLAY_COUNT = "replay_count"
H_REPLAYED_BY = "replayed_by"
H_REPLAYED_AT = "replayed_at"
H_FIRST_SEEN = "first_seen"
H_ORIGINAL_HEADERS = "original_headers"
"""On an invalid or poison dead letter: the message's own headers, as a JSON object."""
H_PAYLOAD_NULL = "payload_null"
H_PAYLOAD_TRUNCATED = "payload_truncated"
"""On a dead letter whose record was larger than any topic may hold (only a foreign record on
a topic dlqapp reads can be): `true`, its payload a preview of `payload_bytes` bytes."""
H_PAYLOAD_BYTES = "payload_bytes"
H_SPENT = "spent"
"""Tokens and cost of a request's attempts so far (compact JSON, dlqapp.core.prices.Spent)."""
H_TENANT = "tenant"
"""On input (optional): the request's tenant when its `metadata.tenant` names none."""
H_BUDGET_HELD = "budget_held"
"""In a parked entry: `true` for a request held over its budget (not a retry)."""
H_RUN_NOW = "run_now"
"""On a due message (dlqapp's internal `dlqapp-due` topic): an operator's "run now", attempted at once."""
H_TRACEPARENT = "traceparent"
"""W3C Trace Context: the trace a request belongs to and the span that wrote this record."""
H_TRACESTATE = "tracestate"
"""W3C Trace Context: vendors' trace data, carried with `traceparent`."""


def header_dict(headers: Mapping[str, Any] | Iterable[tuple[str, Any]] | None) -> dict[str, str]:
    """Kafka headers (mapping or pairs, bytes or str values) as a str → str dict.

    Never raises: undecodable bytes are replaced, a missing value is empty, and of a
    repeated name the last value wins.
    """
    if headers is None:
        return {}
    try:
        items = list(headers.items() if isinstance(headers, Mapping) else headers)
    except (TypeError, ValueError):
        return {}
    out: dict[str, str] = {}
    for item in items:
        try:
            key, value = item
        except (TypeError, ValueError):
            continue
        if isinstance(key, (bytes, bytearray)):
            key = bytes(key).decode("utf-8", "replace")
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode("utf-8", "replace")
        out[str(key)] = "" if value is None else str(value)
    return out


MAX_HEADER_INT = 2**63 - 1


def header_int(headers: Mapping[str, str], name: str) -> int | None:
    """A non-negative integer header, or None when absent or malformed."""
    value = headers.get(name)
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        return None
    number = int(text)
    return number if number <= MAX_HEADER_INT else None


def header_json(headers: Mapping[str, str], name: str, kind: type) -> Any:
    """A JSON header of type `kind`, or None when absent or malformed."""
    value = headers.get(name)
    if value is None:
        return None
    try:
        data = compact_json.loads(value)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, kind) else None


_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.DOTALL)
MAX_TRACESTATE_CHARS = 512
"""The most of a `tracestate` carried on (W3C: at least 512 characters are to be propagated)."""


def trace_context(headers: Mapping[str, str]) -> dict[str, str]:
    """The W3C trace context (`traceparent`, and `tracestate` beside it) a record carries on, or
    an empty dict when it has none or a malformed one (read as absent, never raised).

    A `traceparent` is `version-trace_id-parent_id-flags` in lowercase hex, neither id all
    zeros, version `ff` invalid; version `00` has nothing after the flags, a later version
    may (only its first four fields are read, as the spec asks). A `tracestate` is kept
    only beside a valid `traceparent` and when it is printable ASCII of at most
    `MAX_TRACESTATE_CHARS`; the vendors' entries inside it are not interpreted."""
    value = headers.get(H_TRACEPARENT)
    if value is None or len(value) > 512:
        return {}
    match = _TRACEPARENT.fullmatch(value.strip(" \t"))
    if match is None:
        return {}
    version, trace_id, parent_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == "0" * 32 or parent_id == "0" * 16:
        return {}
    context = {H_TRACEPARENT: f"{version}-{trace_id}-{parent_id}-{flags}"}
    state = headers.get(H_TRACESTATE)
    if state and len(state) <= MAX_TRACESTATE_CHARS and state.isascii() and state.isprintable():
        context[H_TRACESTATE] = state
    return context
