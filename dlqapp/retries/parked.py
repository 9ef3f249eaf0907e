"""The parked-retries table: retries waiting for their due time, keyed so byte order is time order."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Literal, overload

from faust.types import TableT
from rocksdict import Rdict

from dlqapp.core.envelope import Envelope
from dlqapp.core.tiers import Tier, tier_after
from dlqapp.kafka.faust_tables import active_partitions, is_offset_record, partition_db, scan_chunk
from dlqapp.retries.keys import decode_parked_key, parked_key
from dlqapp.retries.scan import SCAN_CHUNK, ScanStarts, head_of_parked


class ParkedRetries:
    """Parks envelopes under `parked_key(due, request_id)` and walks them; counts per tier."""

    def __init__(self, table: TableT, tiers: tuple[Tier, ...]) -> None:
        self.table = table
        self.tiers = tiers
        self.scan_starts = ScanStarts()
        self.by_tier: Counter[int] = Counter()
        self._counted_partitions: frozenset[int] = frozenset()

    def store(self, envelope: Envelope, tier: Tier) -> None:
        """Park an envelope under its due time (idempotent; inside the owning partition's stream).

        dlqapp parks its own retries when it decides them (dlqapp.processing.pipeline), in the same
        stream step that records the state, so a retry never depends on the tier topic
        being consumed; the tier agent then finds the entry already there. Retries that
        others put on a tier topic are parked by the tier agent.
        """
        assert envelope.due_ms is not None
        key = parked_key(envelope.due_ms, envelope.request_id)
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

    def active_dbs(self) -> Iterator[tuple[int, Rdict]]:
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

    @overload
    def walk(self, values: Literal[True]) -> AsyncIterator[tuple[bytes, bytes]]: ...

    @overload
    def walk(self, values: Literal[False]) -> AsyncIterator[tuple[bytes, None]]: ...

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

    async def keys_of(
        self, request_id: str, partition: int, *, hint_due_ms: int | None = None, walk: bool = True
    ) -> list[bytes]:
        """Parked keys of `request_id` on `partition` (an owned one), earliest first.

        `hint_due_ms` (the due time the request's state recorded) finds the usual single
        entry without a walk; otherwise, unless `walk` is False, the partition is walked
        in chunks (keys only).
        """
        if hint_due_ms is not None and self.table.get(parked_key(hint_due_ms, request_id)) is not None:
            return [parked_key(hint_due_ms, request_id)]
        if not walk:
            return []
        db = dict(self.active_dbs()).get(partition)
        if db is None:
            return []
        found: list[bytes] = []
        after: bytes | None = None
        while True:
            chunk = scan_chunk(db, after, SCAN_CHUNK, False)
            found += [
                key
                for key, _ in chunk
                if not is_offset_record(self.table, key) and decode_parked_key(key)[1] == request_id
            ]
            if len(chunk) < SCAN_CHUNK:
                return found
            after = chunk[-1][0]
            await asyncio.sleep(0)

    def next_due(self, budget: int = 500) -> tuple[dict[str, int], int | None]:
        """(earliest due time per tier label, earliest due time of all), from the head of each
        partition: keys sort by due time, so the first entry of a tier is its next due. At most
        `budget` entries are read per partition; a tier not met within it is left out."""
        by_tier: dict[str, int] = {}
        earliest: int | None = None
        for partition, db in self.active_dbs():
            seen: set[str] = set()
            for key, value in head_of_parked(db, self.scan_starts.get(partition, db), budget):
                if is_offset_record(self.table, key):
                    continue
                due_ms, _ = decode_parked_key(key)
                earliest = due_ms if earliest is None else min(earliest, due_ms)
                try:
                    label = self.tier_of(Envelope.from_bytes(value or b"")).label
                except (ValueError, KeyError):
                    continue
                if label not in seen:
                    seen.add(label)
                    by_tier[label] = min(by_tier.get(label, due_ms), due_ms)
                if len(seen) == len(self.tiers):
                    break
        return by_tier, earliest
