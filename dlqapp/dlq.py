"""The dead-letter side: DLQ entries, counts, the JSON-lines log and the alert line.

The `dlq` topic carries each dead letter's original bytes as its value and what dlqapp
knows about it as headers; a null value (tombstone) removes the entry. The DLQ agent
mirrors the topic into the `dead-letters` table.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
from typing import Any

from faust import EventT
from faust.tables import Table

from dlqapp import metrics
from dlqapp.alerts import AlertBatcher
from dlqapp.faust_compat import keys_with_prefix, partition_db
from dlqapp.logs import log_event
from dlqapp.partitioning import owner_partition
from dlqapp.models import (
    H_REPLAY_COUNT,
    H_ATTEMPTS,
    H_DEAD_AT,
    H_ERROR_CLASS,
    H_FINAL_ERROR,
    H_HISTORY,
    H_LAST_ERROR,
    H_ORIGINAL_TIMESTAMP,
    H_RETRY_COUNT,
    H_SOURCE,
    H_REQUEST_ID,
    fallback_key,
    header_dict,
    header_int,
    header_json,
    now_ms,
)

log = logging.getLogger("dlqapp.dlq")


PREVIEW_BYTES = 65536
_UNPROCESSABLE_KEY = re.compile(r"^(?P<request_id>.+)~(?:invalid_request|poison)~[0-9a-f]{12}$", re.DOTALL)


def owner_id(key: str) -> str:
    """The request id a DLQ key belongs to: itself, or the id in an unprocessable copy's key.

    Invalid and poison messages are dead-lettered as `<request id>~<class>~<digest>`, on
    the request id's partition, so they never replace the request's own dead letter.
    """
    match = _UNPROCESSABLE_KEY.match(key)
    return match.group("request_id") if match else key


def find_dead_letter(table: Table, key: str, partitions: int) -> bytes | None:
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
        dead_at = json.loads(blob).get("dead_at") or 0
        if newest is None or dead_at >= newest[0]:
            newest = (dead_at, candidate)
    return newest[1] if newest else None


def build_entry(request_id: str, payload: bytes, headers: dict[str, str], partition: int, offset: int, max_bytes: int | None = None) -> dict[str, Any]:
    """A DLQ entry from a `dlq` topic message: exact payload, headers and attempt history.

    A payload over `max_bytes` is kept only as a preview (`payload_truncated`); its exact
    bytes stay in the `dlq` topic at `dlq.partition`/`dlq.offset`.
    """
    truncated = max_bytes is not None and len(payload) > max_bytes
    size = len(payload)
    if truncated:
        payload = payload[:PREVIEW_BYTES]
    try:
        text: str | None = payload.decode("utf-8", "replace" if truncated else "strict")
    except UnicodeDecodeError:
        text = None
    model = None
    try:
        parsed = json.loads(text) if text else None
        model = parsed.get("model") if isinstance(parsed, dict) else None
    except (ValueError, RecursionError):
        pass
    return {
        "request_id": headers.get(H_REQUEST_ID) or request_id,
        "key": request_id,
        "error_class": headers.get(H_ERROR_CLASS) or "unknown",
        "final_error": headers.get(H_FINAL_ERROR),
        "last_error": headers.get(H_LAST_ERROR),
        "retry_count": header_int(headers, H_RETRY_COUNT) or 0,
        "attempts": header_int(headers, H_ATTEMPTS) or 0,
        "history": [a for a in header_json(headers, H_HISTORY, list) or [] if isinstance(a, dict)],
        "first_seen": header_int(headers, H_ORIGINAL_TIMESTAMP) or None,
        "dead_at": header_int(headers, H_DEAD_AT) or now_ms(),
        "source": header_json(headers, H_SOURCE, dict) or {},
        "model": model if isinstance(model, str) else None,
        "replay_count": header_int(headers, H_REPLAY_COUNT) or 0,
        "payload_text": text,
        "payload_b64": base64.b64encode(payload).decode() if text is None else None,
        "payload_bytes": size,
        "payload_truncated": truncated,
        "headers": headers,
        "dlq": {"partition": partition, "offset": offset},
    }


def original_payload(entry: dict[str, Any]) -> bytes:
    """The dead letter's payload, byte for byte."""
    if entry.get("payload_b64") is not None:
        return base64.b64decode(entry["payload_b64"])
    return (entry.get("payload_text") or "").encode("utf-8")


def presented(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry as the API shows it: `payload` is the parsed JSON when the bytes are JSON."""
    shown = dict(entry)
    text = entry.get("payload_text")
    try:
        shown["payload"] = json.loads(text) if text else None
    except (ValueError, RecursionError):
        shown["payload"] = text
    return shown


def summary(entry: dict[str, Any]) -> dict[str, Any]:
    """The fields a list shows, with a short payload preview."""
    text = entry.get("payload_text")
    preview = text[:160] if text is not None else f"<{entry.get('payload_bytes', 0)} bytes, not UTF-8>"
    keys = ("request_id", "key", "error_class", "final_error", "model", "attempts", "retry_count", "replay_count", "first_seen", "dead_at")
    return {**{k: entry.get(k) for k in keys}, "payload_preview": preview}


class DeadLetterRecorder:
    """Mirrors the `dlq` topic into the DLQ table, the JSON-lines log and alert lines."""

    def __init__(self, table: Table, log_path: str, alerts: "AlertBatcher | None" = None, max_payload_bytes: int | None = None) -> None:
        self.table = table
        self.log_path = log_path
        self.max_payload_bytes = max_payload_bytes
        self.alerts = alerts
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)

    async def on_message(self, event: EventT) -> None:
        raw_key = event.key if isinstance(event.key, (bytes, bytearray)) and event.key else fallback_key(event.value).encode()
        request_id = bytes(raw_key).decode("utf-8", "replace")
        key = request_id.encode()
        if event.value is None:
            self.table.pop(key, None)
            return
        message = event.message
        previous = self.table.get(key)
        if previous is not None and json.loads(previous).get("dlq") == {"partition": message.partition, "offset": message.offset}:
            return  # redelivered after a crash: already recorded, logged and alerted
        entry = build_entry(request_id, event.value, header_dict(event.headers), message.partition, message.offset, self.max_payload_bytes)
        self.table[key] = json.dumps(entry, separators=(",", ":")).encode()
        self._append_to_log(entry)
        log_event(
            log,
            logging.WARNING,
            "dead_letter",
            request_id=request_id,
            topic=entry["source"].get("topic"),
            attempt=entry["attempts"],
            error_class=entry["error_class"],
            retry_count=entry["retry_count"],
            final_error=(entry["final_error"] or "")[:300],
        )
        metrics.dead_letters.labels(entry["error_class"]).inc()
        metrics.requests.labels("dead_lettered").inc()
        if self.alerts is not None:
            self.alerts.add(request_id, entry["error_class"])

    def _append_to_log(self, entry: dict[str, Any]) -> None:
        line = json.dumps({k: v for k, v in entry.items() if k != "headers"}, separators=(",", ":"))
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
