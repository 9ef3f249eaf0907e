"""The `dlq` agent's work: mirror the topic into the DLQ table, the JSON-lines log and alerts.

The `dlq` topic carries each dead letter's original bytes as its value and what dlqapp
knows about it as headers; a null value (tombstone) removes the entry.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from faust.types import TableT

from dlqapp.core.record import Record
from dlqapp.core.requests import fallback_key
from dlqapp.deadletters.alerts import AlertBatcher
from dlqapp.deadletters.entries import DeadLetterEntry, time_key
from dlqapp.deadletters.log_file import DeadLetterLog
from dlqapp.kafka.faust_tables import active_partitions, partition_db, scan_chunk
from dlqapp.observability import metrics
from dlqapp.observability.logs import log_event
from dlqapp.tables.counters import Counters

log = logging.getLogger("dlqapp.deadletters.recorder")


class OldestDeadLetter:
    """When the oldest dead letter on this worker died, from a background walk of the
    DLQ table at most every `every_s` (a stats read never waits for it)."""

    CHUNK = 1000

    def __init__(self, table: TableT, every_s: float = 30.0) -> None:
        self.table = table
        self.every_s = every_s
        self.value: int | None = None
        self._walked_at = float("-inf")
        self._walk: asyncio.Task[None] | None = None

    def recorded(self, dead_at: int | None) -> None:
        """A dead letter was recorded here: older than the oldest known, or the first since the
        last walk, it is the oldest at once (a walk only every `every_s`)."""
        if dead_at is not None and (self.value is None or dead_at < self.value):
            self.value = dead_at

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
        value = DeadLetterEntry.decode(blob).dead_at
    except (ValueError, TypeError, UnicodeDecodeError):
        return None  # Faust's offset record, not an entry
    return value if isinstance(value, int) else None


class DeadLetterRecorder:
    """Mirrors the `dlq` topic into the DLQ table, the JSON-lines log and alert lines."""

    def __init__(
        self,
        table: TableT,
        by_time: TableT,
        *,
        counters: Counters,
        log: DeadLetterLog,
        alerts: AlertBatcher | None = None,
        max_payload_bytes: int | None = None,
        oldest: OldestDeadLetter | None = None,
    ) -> None:
        self.table = table
        self.oldest = oldest
        self.by_time = by_time
        self.counters = counters
        self.log = log
        self.max_payload_bytes = max_payload_bytes
        self.alerts = alerts

    async def on_message(self, record: Record) -> None:
        """Record one message of the `dlq` topic (a tombstone removes its entry)."""
        request_id = record.key_text or fallback_key(record.payload)
        key = request_id.encode()
        if record.payload is None:
            self.remove(key)
            return
        previous = self.table.get(key)
        old = DeadLetterEntry.decode(previous) if previous is not None else None
        if old is not None and old.dlq == {"partition": record.partition, "offset": record.offset}:
            return  # redelivered after a crash: already recorded, logged and alerted
        entry = DeadLetterEntry.from_message(
            request_id,
            record.payload,
            record.headers,
            partition=record.partition,
            offset=record.offset,
            max_bytes=self.max_payload_bytes,
        )
        if old is not None:
            self._unindex(key, old)
        self.table[key] = entry.encode()
        self._index(key, entry)
        if self.oldest is not None:
            self.oldest.recorded(entry.dead_at)
        self._append_to_log(entry)
        log_event(
            log,
            logging.WARNING,
            "dead_letter",
            request_id=request_id,
            topic=entry.source.get("topic"),
            attempt=entry.attempts,
            error_class=entry.error_class,
            retry_count=entry.retry_count,
            final_error=(entry.final_error or "")[:300],
        )
        metrics.dead_letters.labels(entry.error_class).inc()
        metrics.requests.labels("dead_lettered").inc()
        if self.alerts is not None:
            self.alerts.add(request_id, entry.error_class)

    def remove(self, key: bytes) -> None:
        """Drop an entry (a tombstone, a replay, a discard) and its counts."""
        blob = self.table.get(key)
        if blob is None:
            return
        del self.table[key]
        self._unindex(key, DeadLetterEntry.decode(blob))

    def _index(self, key: bytes, entry: DeadLetterEntry) -> None:
        """Count an entry and list it in the time index (newest-first pages read only that)."""
        self.by_time[time_key(entry.dead_at or 0, key)] = json.dumps(entry.summary(), separators=(",", ":")).encode()
        self._count(entry, +1)

    def _unindex(self, key: bytes, entry: DeadLetterEntry) -> None:
        self.by_time.pop(time_key(entry.dead_at or 0, key), None)
        self._count(entry, -1)

    def _count(self, entry: DeadLetterEntry, sign: int) -> None:
        self.counters.add("dlq_size", sign)
        self.counters.add(f"dlq_class|{entry.error_class or 'unknown'}", sign)
        self.counters.add(f"dlq_model|{entry.model or '(none)'}", sign)

    def _append_to_log(self, entry: DeadLetterEntry) -> None:
        self.log.append(json.dumps({k: v for k, v in entry.as_dict().items() if k != "headers"}, separators=(",", ":")))
