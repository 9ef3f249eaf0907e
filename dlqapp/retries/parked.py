"""The parked-retries table: retries waiting for their due time, keyed so byte order is time order."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, AsyncIterator, Iterator

from faust.tables import Table

from dlqapp.core.envelope import Envelope
from dlqapp.core.tiers import Tier, tier_after
from dlqapp.retries.keys import parked_key
from dlqapp.retries.scan import SCAN_CHUNK, ScanStarts
from dlqapp.worker.faust_compat import active_partitions, is_offset_record, partition_db, scan_chunk


class ParkedRetries:
    """Parks envelopes under `parked_key(due, request_id)` and walks them; counts per tier."""

    def __init__(self, table: Table, tiers: tuple[Tier, ...]) -> None:
        self.table = table
        self.tiers = tiers
        self.scan_starts = ScanStarts()
        self.by_tier: Counter[int] = Counter()
        self._counted_partitions: frozenset[int] = frozenset()

    def store(self, envelope: Envelope, tier: Tier) -> None:
        """Park an envelope under its due time (idempotent; inside the owning partition's stream).

        dlqapp parks its own retries when it decides them (dlqapp.worker.pipeline), in the same
        stream step that records the state, so a retry never depends on the tier topic
        being consumed; the tier agent then finds the entry already there. Retries that
        others put on a tier topic are parked by the tier agent.
        """
        assert envelope.scheduled_time is not None
        key = parked_key(envelope.scheduled_time, envelope.request_id)
        if self.table.get(key) is not None:
            return
        self.by_tier[tier.index] += 1
        self.table[key] = envelope.to_bytes()
        self.scan_starts.lower_to(key)

    def get(self, key: bytes) -> Envelope | None:
        blob = self.table.get(key)
        return Envelope.from_bytes(blob) if blob is not None else None

    def delete(self, key: bytes, tier: Tier) -> None:
        """Remove a parked retry that waited in `tier` (inside the owning partition's stream)."""
        del self.table[key]
        self.by_tier[tier.index] -= 1

    def tier_of(self, envelope: Envelope) -> Tier:
        """The tier a parked envelope waits in: the one after its last failed attempt."""
        return tier_after(envelope.attempts, self.tiers)

    def active_dbs(self) -> Iterator[tuple[int, Any]]:
        """(partition, RocksDB) of every partition this worker actively owns."""
        for partition in active_partitions(self.table):
            yield partition, partition_db(self.table, partition)

    def by_tier_label(self) -> dict[str, int]:
        """Parked retries per tier label, for metrics."""
        return {tier.label: max(0, self.by_tier[tier.index]) for tier in self.tiers}

    async def recount_if_reassigned(self) -> None:
        """After a rebalance or a restart, count parked retries per tier again."""
        partitions = frozenset(active_partitions(self.table))
        if partitions == self._counted_partitions:
            return
        self._counted_partitions = partitions
        counts: Counter[int] = Counter()
        async for _, value in self.walk(values=True):
            counts[self.tier_of(Envelope.from_bytes(value)).index] += 1
        self.by_tier = counts

    async def count(self) -> int:
        """Retries parked on the partitions this worker actively owns (an exact count)."""
        total = 0
        async for _ in self.walk(values=False):
            total += 1
        return total

    async def walk(self, values: bool) -> AsyncIterator[tuple[bytes, bytes | None]]:
        """Every parked (key, value) on active partitions, in chunks.

        Never holds an iterator across an await (a rebalance may close the store), and
        yields to the event loop between chunks, so a table of millions of entries can
        be walked while the timer and the agents keep running.
        """
        for _, db in list(self.active_dbs()):
            after: bytes | None = None
            while True:
                chunk = scan_chunk(db, after, SCAN_CHUNK, values)
                for key, value in chunk:
                    if not is_offset_record(self.table, key):
                        yield key, value
                if len(chunk) < SCAN_CHUNK:
                    break
                after = chunk[-1][0]
                await asyncio.sleep(0)
