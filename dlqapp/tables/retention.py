"""Retention: settled request states and old replay ledgers are forgotten after a while.

The sweeper walks each actively owned partition of the `requests` and `replay-ledger`
tables a chunk at a time (never blocking the loop for long), and sends the keys it found
expired to the operator agent on that partition (tables can only be written inside a
stream). The agent deletes each key only if it has not changed since it was read, and
Faust writes a tombstone, so the changelog shrinks too.

Expired: a request `succeeded` or `discarded` whose last change is older than
DLQ_STATE_RETENTION (dedup forgets the id then), and a replay ledger whose newest record
is that old and whose request is no longer in the DLQ.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from dlqapp.core import compact_json, states
from dlqapp.core.states import StoredState
from dlqapp.kafka.faust_tables import active_partitions, partition_db, scan_chunk

EXPIRED_STATES = frozenset({states.SUCCEEDED, states.DISCARDED})
CHUNK = 2000
PASS_SHARE = 10
MIN_PASS_MS, MAX_PASS_MS = 1_000, 3_600_000
"""A pass over a table partition starts at most every retention / PASS_SHARE (between 1 s
and 1 h): an expired entry goes at most that much later. Without the pause a small table
was decoded whole every second, a tenth of a busy worker's CPU (bench overhead profile)."""

Expire = Callable[[str, int, list[tuple[str, int]]], Awaitable[None]]
"""Sends (table name, partition, [(key, last change)]) to the operator agent."""


def request_last_change(blob: bytes) -> int | None:
    """When a settled request last changed, or None when it is not expirable."""
    try:
        record = StoredState.decode(blob)
    except (ValueError, UnicodeDecodeError):
        return None  # Faust's offset record, not a state
    if record is None or record.state not in EXPIRED_STATES:
        return None
    return record.updated_at if isinstance(record.updated_at, int) else None


def ledger_last_change(blob: bytes) -> int | None:
    """When a replay ledger last changed (its newest record), or None."""
    try:
        records = compact_json.loads(blob)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(records, list) or not records or not isinstance(records[-1], dict):
        return None
    at = records[-1].get("at")
    return at if isinstance(at, int) else None


@dataclass
class SweptTable:
    table: Any
    last_change: Callable[[bytes], int | None]
    keep: Callable[[bytes], bool] = lambda key: False
    """Keys to keep even when expired (a ledger whose request is still in the DLQ)."""


class Sweeper:
    """Walks tables a chunk per partition per call and expires what is old enough."""

    def __init__(self, tables: list[SweptTable], retention_ms: int, expire: Expire) -> None:
        self.tables = tables
        self.retention_ms = retention_ms
        self.expire = expire
        self.pass_interval_ms = min(MAX_PASS_MS, max(MIN_PASS_MS, retention_ms // PASS_SHARE))
        self._cursors: dict[tuple[str, int], bytes | None] = {}
        self._next_pass_ms: dict[tuple[str, int], int] = {}

    async def sweep(self, now_ms: int) -> int:
        """One chunk of each table partition; returns how many keys were sent to expire."""
        sent = 0
        cutoff = now_ms - self.retention_ms
        for swept in self.tables:
            for partition in active_partitions(swept.table):
                if not self._due(swept.table.name, partition, now_ms):
                    continue
                expired = self._chunk(swept, partition, cutoff)
                if expired:
                    await self.expire(swept.table.name, partition, expired)
                    sent += len(expired)
        return sent

    def _due(self, table: str, partition: int, now_ms: int) -> bool:
        """Whether to sweep a chunk now: inside a pass always, a new pass once the last began long enough ago."""
        key = (table, partition)
        if self._cursors.get(key) is not None:
            return True
        if now_ms < self._next_pass_ms.get(key, 0):
            return False
        self._next_pass_ms[key] = now_ms + self.pass_interval_ms
        return True

    def _chunk(self, swept: SweptTable, partition: int, cutoff: int) -> list[tuple[str, int]]:
        cursor_key = (swept.table.name, partition)
        chunk = scan_chunk(partition_db(swept.table, partition), self._cursors.get(cursor_key), CHUNK)
        self._cursors[cursor_key] = chunk[-1][0] if len(chunk) == CHUNK else None  # wrap around at the end
        expired = []
        for key, blob in chunk:
            at = swept.last_change(blob)
            if at is not None and at < cutoff and not swept.keep(key):
                expired.append((key.decode("utf-8", "replace"), at))
        return expired

    def forget_cursors(self) -> None:
        """After a rebalance the partitions may be others."""
        self._cursors.clear()
        self._next_pass_ms.clear()


def still_unchanged(blob: bytes | None, at: int, last_change: Callable[[bytes], int | None]) -> bool:
    """Whether a stored value is still the expired one the sweeper saw."""
    return blob is not None and last_change(blob) == at
