"""The dead-letter side: DLQ entries, counts, the JSON-lines log and the alert line.

The `dlq` topic carries each dead letter's original bytes as its value and what dlqapp
knows about it as headers; a null value (tombstone) removes the entry. The DLQ agent
mirrors the topic into the `dead-letters` table.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import time
from typing import Any

from faust import EventT
from faust.tables import Table

from dlqapp import metrics
from dlqapp.alerts import AlertBatcher
from dlqapp.counters import Counters
from dlqapp.faust_compat import active_partitions, keys_with_prefix, partition_db, scan_chunk
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


def rotate(path: str, backups: int) -> None:
    """`path` becomes `path.1`, `path.1` becomes `path.2`, …; the oldest beyond `backups` goes."""
    for n in range(backups - 1, 0, -1):
        if os.path.exists(f"{path}.{n}"):
            os.replace(f"{path}.{n}", f"{path}.{n + 1}")
    os.replace(path, f"{path}.1")


class OldestDeadLetter:
    """When the oldest dead letter on this worker died, from a background walk of the
    DLQ table at most every `every_s` (a stats read never waits for it)."""

    CHUNK = 1000

    def __init__(self, table: Table, every_s: float = 30.0) -> None:
        self.table = table
        self.every_s = every_s
        self.value: int | None = None
        self._walked_at = float("-inf")
        self._walk: asyncio.Task[None] | None = None

    def get(self) -> int | None:
        if time.monotonic() - self._walked_at >= self.every_s and (self._walk is None or self._walk.done()):
            self._walk = asyncio.ensure_future(self._refresh())
        return self.value

    async def _refresh(self) -> None:
        oldest: int | None = None
        for partition in active_partitions(self.table):
            db = partition_db(self.table, partition)
            after: bytes | None = None
            while True:
                chunk = scan_chunk(db, after, self.CHUNK)
                for _, blob in chunk:
                    dead_at = _dead_at(blob)
                    if dead_at is not None and (oldest is None or dead_at < oldest):
                        oldest = dead_at
                if len(chunk) < self.CHUNK:
                    break
                after = chunk[-1][0]
                await asyncio.sleep(0)
        self.value = oldest
        self._walked_at = time.monotonic()


def _dead_at(blob: bytes) -> int | None:
    try:
        entry = json.loads(blob)
    except (ValueError, UnicodeDecodeError):
        return None  # Faust's offset record, not an entry
    value = entry.get("dead_at") if isinstance(entry, dict) else None
    return value if isinstance(value, int) else None


class DeadLetterRecorder:
    """Mirrors the `dlq` topic into the DLQ table, the JSON-lines log and alert lines."""

    def __init__(
        self,
        table: Table,
        counters: Counters,
        log_path: str,
        alerts: "AlertBatcher | None" = None,
        max_payload_bytes: int | None = None,
        log_max_bytes: int = 64 * 1024 * 1024,
        log_backups: int = 5,
    ) -> None:
        self.table = table
        self.counters = counters
        self.log_path = log_path
        self.log_max_bytes = log_max_bytes
        self.log_backups = log_backups
        self.max_payload_bytes = max_payload_bytes
        self.alerts = alerts
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)

    async def on_message(self, event: EventT) -> None:
        raw_key = event.key if isinstance(event.key, (bytes, bytearray)) and event.key else fallback_key(event.value).encode()
        request_id = bytes(raw_key).decode("utf-8", "replace")
        key = request_id.encode()
        if event.value is None:
            self.remove(key)
            return
        message = event.message
        previous = self.table.get(key)
        if previous is not None and json.loads(previous).get("dlq") == {"partition": message.partition, "offset": message.offset}:
            return  # redelivered after a crash: already recorded, logged and alerted
        entry = build_entry(request_id, event.value, header_dict(event.headers), message.partition, message.offset, self.max_payload_bytes)
        if previous is not None:
            self._count(json.loads(previous), -1)
        self.table[key] = json.dumps(entry, separators=(",", ":")).encode()
        self._count(entry, +1)
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

    def remove(self, key: bytes) -> None:
        """Drop an entry (a tombstone, a replay, a discard) and its counts."""
        blob = self.table.get(key)
        if blob is None:
            return
        del self.table[key]
        self._count(json.loads(blob), -1)

    def _count(self, entry: dict[str, Any], sign: int) -> None:
        self.counters.add("dlq_size", sign)
        self.counters.add(f"dlq_class|{entry.get('error_class') or 'unknown'}", sign)
        self.counters.add(f"dlq_model|{entry.get('model') or '(none)'}", sign)

    def _append_to_log(self, entry: dict[str, Any]) -> None:
        line = json.dumps({k: v for k, v in entry.items() if k != "headers"}, separators=(",", ":"))
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")
            size = f.tell()
        if size >= self.log_max_bytes:
            rotate(self.log_path, self.log_backups)
