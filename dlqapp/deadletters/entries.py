"""DLQ entries: built from a `dlq` message, stored typed, shown by the API, found by request id."""

from __future__ import annotations

import base64
import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from faust.types import TableT

from dlqapp.core import compact_json
from dlqapp.core.clock import now_ms
from dlqapp.core.headers import (
    H_ATTEMPTS,
    H_DEAD_AT,
    H_ERROR_CLASS,
    H_FINAL_ERROR,
    H_HISTORY,
    H_LAST_ERROR,
    H_ORIGINAL_TIMESTAMP,
    H_PAYLOAD_BYTES,
    H_PAYLOAD_TRUNCATED,
    H_REPLAY_COUNT,
    H_REQUEST_ID,
    H_RETRY_COUNT,
    H_SOURCE,
    H_SPENT,
    H_TENANT,
    header_int,
    header_json,
)
from dlqapp.core.partitioning import owner_partition
from dlqapp.core.prices import Spent
from dlqapp.core.requests import loads_shown
from dlqapp.kafka.faust_tables import keys_with_prefix, partition_db

PREVIEW_BYTES = 65536
_UNPROCESSABLE_KEY = re.compile(r"^(?P<request_id>.+)~(?:invalid_request|poison)~[0-9a-f]{12}$", re.DOTALL)


def owner_id(key: str) -> str:
    """The request id a DLQ key belongs to: itself, or the id in an unprocessable copy's key.

    Invalid and poison messages are dead-lettered as `<request id>~<class>~<digest>`, on
    the request id's partition, so they never replace the request's own dead letter.
    """
    match = _UNPROCESSABLE_KEY.match(key)
    return match.group("request_id") if match else key


_DEAD_AT = struct.Struct(">Q")


def time_key(dead_at: int, key: bytes) -> bytes:
    """Key of an entry in the DLQ time index: `u64 BE dead_at ‖ DLQ key`, so byte order is time order."""
    return _DEAD_AT.pack(max(0, dead_at)) + key


def unprocessable_key(request_id: str, error_class: str, position: str) -> str:
    """The DLQ key of an invalid or poison message that carries `request_id`."""
    return f"{request_id}~{error_class}~{position}"


def find_dead_letter(table: TableT, key: str, partitions: int) -> bytes | None:
    """The table key for `key`: itself, else its newest unprocessable copy (on this worker)."""
    exact = key.encode()
    if table.get(exact) is not None:
        return exact
    if owner_id(key) != key:
        return None
    prefix = exact + b"~"
    db = partition_db(table, owner_partition(key, partitions))
    newest: tuple[int, bytes] | None = None
    for candidate in keys_with_prefix(db, prefix, limit=100):
        blob = table.get(candidate)
        if blob is None or owner_id(candidate.decode("utf-8", "replace")) != key:
            continue
        dead_at = DeadLetterEntry.decode(blob).dead_at or 0
        if newest is None or dead_at >= newest[0]:
            newest = (dead_at, candidate)
    return newest[1] if newest else None


@dataclass(slots=True)
class DeadLetterEntry:
    """A DLQ entry: one `dlq` message's exact payload, headers and attempt history.

    A payload over DLQ_MAX_PAYLOAD_BYTES is kept only as a preview (`payload_truncated`);
    its exact bytes stay in the `dlq` topic at `dlq.partition`/`dlq.offset`. Encoded as one
    JSON object (the shape `GET /dlq/{id}/` shows, with `payload` added).
    """

    request_id: str
    key: str
    error_class: str
    final_error: str | None
    last_error: str | None
    retry_count: int
    attempts: int
    history: list[dict[str, Any]]
    first_seen: int | None
    dead_at: int
    source: dict[str, Any]
    model: str | None
    replay_count: int
    payload_text: str | None
    payload_b64: str | None
    payload_bytes: int
    payload_truncated: bool
    headers: dict[str, str]
    dlq: dict[str, int]
    tokens: dict[str, int] | None = None
    """Tokens of the request's attempts so far (`prompt`, `completion`, `cached`)."""
    cost_usd: float | None = None
    """What the request's attempts cost so far, in US dollars."""
    cost_estimated: bool | None = None
    """Part of `tokens` is dlqapp's estimate (a failed call that reported no usage)."""
    unpriced: bool | None = None
    """Some attempt ran on a model without a price: `cost_usd` leaves it out."""
    tenant: str | None = None

    @classmethod
    def from_message(
        cls,
        key: str,
        payload: bytes,
        headers: Mapping[str, str],
        *,
        partition: int,
        offset: int,
        max_bytes: int | None = None,
    ) -> DeadLetterEntry:
        """The entry of a `dlq` message (its key, payload and parsed headers)."""
        truncated = max_bytes is not None and len(payload) > max_bytes
        size = len(payload)
        if headers.get(H_PAYLOAD_TRUNCATED) == "true":  # the record itself holds a preview only
            truncated, size = True, header_int(headers, H_PAYLOAD_BYTES) or size
        if truncated:
            payload = payload[:PREVIEW_BYTES]
        try:
            text: str | None = payload.decode("utf-8", "replace" if truncated else "strict")
        except UnicodeDecodeError:
            text = None
        if text is not None and len(payload) > 64 * 1024 and len(json.dumps(text)) > len(payload) * 3 // 2:
            text = None  # a large payload mostly escapes: base64 keeps the entry small (Settings.table_record_bytes)
        return cls(
            request_id=headers.get(H_REQUEST_ID) or key,
            key=key,
            error_class=headers.get(H_ERROR_CLASS) or "unknown",
            final_error=headers.get(H_FINAL_ERROR),
            last_error=headers.get(H_LAST_ERROR),
            retry_count=header_int(headers, H_RETRY_COUNT) or 0,
            attempts=header_int(headers, H_ATTEMPTS) or 0,
            history=[a for a in header_json(headers, H_HISTORY, list) or [] if isinstance(a, dict)],
            first_seen=header_int(headers, H_ORIGINAL_TIMESTAMP) or None,
            dead_at=header_int(headers, H_DEAD_AT) or now_ms(),
            source=header_json(headers, H_SOURCE, dict) or {},
            model=_model_of(text),
            replay_count=header_int(headers, H_REPLAY_COUNT) or 0,
            payload_text=text,
            payload_b64=base64.b64encode(payload).decode() if text is None else None,
            payload_bytes=size,
            payload_truncated=truncated,
            headers=dict(headers),
            dlq={"partition": partition, "offset": offset},
            **_spent_fields(headers),
        )

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _ENTRY_FIELDS}

    def encode(self) -> bytes:
        return json.dumps(self.as_dict(), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, blob: bytes) -> DeadLetterEntry:
        """The entry stored in `blob`; ValueError when it holds none (Faust's offset record)."""
        doc = compact_json.loads(blob)
        if not isinstance(doc, dict):
            raise ValueError("a DLQ entry is a JSON object")
        fields: dict[str, Any] = {name: doc.get(name) for name in _ENTRY_FIELDS}
        return cls(**fields)

    def original_payload(self) -> bytes:
        """The dead letter's payload, byte for byte."""
        if self.payload_b64 is not None:
            return base64.b64decode(self.payload_b64)
        return (self.payload_text or "").encode("utf-8")

    def presented(self) -> dict[str, Any]:
        """The entry as the API shows it: `payload` is the parsed JSON when the bytes are JSON."""
        shown = self.as_dict()
        try:
            shown["payload"] = loads_shown(self.payload_text) if self.payload_text else None
        except (ValueError, RecursionError):
            shown["payload"] = self.payload_text
        return shown

    def summary(self) -> dict[str, Any]:
        """The fields a list shows, with a short payload preview."""
        text = self.payload_text
        preview = text[:160] if text is not None else f"<{self.payload_bytes or 0} bytes, not UTF-8>"
        return {**{k: getattr(self, k) for k in _SUMMARY_FIELDS}, "payload_preview": preview}


_ENTRY_FIELDS = tuple(f.name for f in fields(DeadLetterEntry))
_SUMMARY_FIELDS = (
    "request_id",
    "key",
    "error_class",
    "final_error",
    "last_error",
    "model",
    "attempts",
    "retry_count",
    "replay_count",
    "first_seen",
    "dead_at",
    "cost_usd",
    "tenant",
)


def _spent_fields(headers: Mapping[str, str]) -> dict[str, Any]:
    """`tokens`, `cost_usd` and `cost_estimated` from the `spent` header; the tenant header."""
    spent = Spent.decode(headers.get(H_SPENT))
    return {
        "tokens": spent.usage.tokens(),
        "cost_usd": spent.cost_usd,
        "cost_estimated": spent.usage.estimated or None,
        "unpriced": spent.unpriced or None,
        "tenant": headers.get(H_TENANT) or None,
    }


def _model_of(text: str | None) -> str | None:
    """The `model` a JSON payload names, if any."""
    try:
        parsed = loads_shown(text) if text else None
    except (ValueError, RecursionError):
        return None
    model = parsed.get("model") if isinstance(parsed, dict) else None
    return model if isinstance(model, str) else None
