"""Running counts for `/dlq/stats/` and `/metrics`, kept as events happen.

Each partition has one counter blob in the `stats` table (key `p<partition>`), so the
counts survive restarts and move with their partition; a read costs the same with a
thousand or a million requests in the tables. Counts change only inside the stream of
their partition (the event being handled names it); the blob is written at the end of a
handler, at most every `FLUSH_INTERVAL_S` per partition while other handlers of the
partition are still running, so a request costs no extra changelog write in a busy
partition. The last handler of a burst always writes: a partition at rest has its exact
counts on the broker, and a crash can lose only the increments of the last interval of
a partition still busy (which its next handlers would have written).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from faust import current_event

from dlqapp.kafka.faust_tables import active_partitions, read_partition

FLUSH_INTERVAL_S = 0.25


def faust_step_partition() -> int | None:
    """The partition of Faust's current stream step (None outside one)."""
    event = current_event()
    return None if event is None else event.message.partition


def _key(partition: int) -> bytes:
    return f"p{partition}".encode()


class Counters:
    """Per-partition counters: `add` in a stream step, `flush_due` at its end, `total` to read."""

    def __init__(
        self,
        table: Any,
        open_steps: Callable[[int], int],
        observe: Callable[[str, int], None] = lambda name, amount: None,
        step_partition: Callable[[], int | None] | None = None,
    ) -> None:
        """`open_steps(partition)` says how many handlers of the partition are running (the
        caller's included); `observe(name, amount)` sees every counted change (the health
        page's minute rates)."""
        self.table = table
        self.open_steps = open_steps
        self.step_partition = step_partition or faust_step_partition
        """The partition of the stream step running now (None outside one)."""
        self.observe = observe
        self._counts: dict[int, Counter[str]] = {}
        self._written_at: dict[int, float] = {}
        self._dirty: set[int] = set()
        self._written: dict[int, bytes] = {}
        self._stale: dict[int, tuple[Counter[str], bytes | None]] = {}

    def add(self, name: str, amount: int = 1) -> None:
        """Count `amount` more of `name` on the current event's partition."""
        partition = self.step_partition()
        if partition is None:
            return
        self._load(partition)[name] += amount
        self._dirty.add(partition)
        self.observe(name, amount)

    def flush_due(self) -> None:
        """Write the current partition's blob if it changed, unless it was written lately
        and another handler of the partition is still running (it will write it)."""
        partition = self.step_partition()
        if partition is None or partition not in self._dirty:
            return
        now = time.monotonic()
        if now - self._written_at.get(partition, 0.0) >= FLUSH_INTERVAL_S or self.open_steps(partition) <= 1:
            blob = json.dumps(self._counts[partition], separators=(",", ":")).encode()
            self.table[_key(partition)] = blob
            self._written[partition] = blob
            self._written_at[partition] = now
            self._dirty.discard(partition)

    async def write_unwritten(self, send: Callable[[bytes, bytes, int], Awaitable[None]]) -> int:
        """Write every partition's counts not yet written with `send(key, blob, partition)`
        (straight to the changelog): on a rebalance or a shutdown no stream step is left to
        write them, and the next owner would start from older counts. Returns how many."""
        written = 0
        for partition in sorted(self._dirty):
            blob = json.dumps(self._counts[partition], separators=(",", ":")).encode()
            await send(_key(partition), blob, partition)
            # Not `_written`: this worker's store gets the blob only when it recovers the
            # changelog, so a partition that stays must still compare with the last step's blob.
            self._written_at[partition] = time.monotonic()
            written += 1
        self._dirty.clear()
        return written

    def on_revoked(self) -> None:
        """A rebalance: keep what was counted, to resume with it should the partition come
        back unchanged (its stored blob still the one this worker wrote last)."""
        for partition, counts in self._counts.items():
            self._stale[partition] = (counts, self._written.get(partition))
        self._counts.clear()
        self._dirty.clear()

    def total(self, partitions: Iterable[int], read: Any) -> Counter[str]:
        """The sum over `partitions`; `read(partition, key)` reads a stored blob outside a stream."""
        total: Counter[str] = Counter()
        for partition in partitions:
            counts = self._counts.get(partition)
            if counts is None:
                counts = _decode(read(partition, _key(partition)))
            total.update(counts)
        return total

    def total_of(self, table: Any) -> Counter[str]:
        """The sum over the partitions of `table` this worker actively owns."""
        return self.total(active_partitions(table), lambda partition, key: read_partition(table, partition, key))

    def _load(self, partition: int) -> Counter[str]:
        counts = self._counts.get(partition)
        if counts is None:
            stored = self.table.get(_key(partition))
            kept, written = self._stale.pop(partition, (None, None))
            if kept is not None and stored == written:
                counts = kept  # nobody else counted meanwhile: keep the increments not yet written
                self._dirty.add(partition)
            else:
                counts = _decode(stored)
            self._counts[partition] = counts
        return counts


def _decode(blob: bytes | None) -> Counter[str]:
    if not blob:
        return Counter()
    try:
        data = json.loads(blob)
    except ValueError:
        return Counter()
    return Counter({k: v for k, v in data.items() if isinstance(v, int)}) if isinstance(data, dict) else Counter()


def grouped(total: Counter[str], prefix: str) -> dict[str, int]:
    """`{label: n}` of the counters named `<prefix>|<label>` (zeroes left out)."""
    start = prefix + "|"
    return {name[len(start) :]: n for name, n in total.items() if name.startswith(start) and n}
