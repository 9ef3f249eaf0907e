"""Running counts for `/dlq/stats/` and `/metrics`, kept as events happen.

Each partition has one counter blob in the `stats` table (key `p<partition>`), so the counts
survive restarts and move with their partition; a read costs the same with a thousand or a
million requests in the tables. Counts move only inside a stream step (`add`); a step's
counts join its partition's when it ends (dlqapp.tables.steps), and the blob is written:

- under exactly_once, into the partition's transaction when it is sealed, so the counts
  commit with the outputs and states that moved them: after a `kill -9` they agree with
  the topics exactly;
- under at_least_once, at the end of a step, at most every `FLUSH_INTERVAL_S` per partition
  while other steps of the partition are running (the last step of a burst always writes):
  a crash can lose only the increments of the last interval of a busy partition.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from dlqapp.core import compact_json
from dlqapp.kafka.faust_tables import active_partitions, read_partition

FLUSH_INTERVAL_S = 0.25


class CurrentStep(Protocol):
    """Where the current step's counts are kept (dlqapp.tables.steps.StepContext)."""

    def required(self, what: str) -> Any: ...


def _key(partition: int) -> bytes:
    return f"p{partition}".encode()


class Counters:
    """Per-partition counters: `add` in a stream step; the steps write them (module doc)."""

    def __init__(
        self,
        table: Any,
        steps: CurrentStep,
        *,
        observe: Callable[[str, int], None] = lambda name, amount: None,
        read: Callable[[int, bytes], bytes | None] | None = None,
        forget: Callable[[str], bool] | None = None,
    ) -> None:
        """`observe(name, amount)` sees every counted change (the health page's minute rates);
        `read(partition, key)` reads the stored blob of a partition (default: its RocksDB);
        `forget(name)`: a counter no longer needed (a past spend window), dropped from the
        blob whenever a step counts a name the partition did not have yet."""
        self.table = table
        self.steps = steps
        self.observe = observe
        self.read = read or (lambda partition, key: read_partition(table, partition, key))
        self.forget = forget
        self._counts: dict[int, Counter[str]] = {}
        self._written_at: dict[int, float] = {}
        self._dirty: set[int] = set()
        self._written: dict[int, bytes] = {}
        self._stale: dict[int, tuple[Counter[str], bytes | None]] = {}

    def add(self, name: str, amount: int = 1) -> None:
        """Count `amount` more of `name` in the current step (its partition's once it ends)."""
        self.steps.required(f"counting {name}").counts[name] += amount
        self.observe(name, amount)

    def merge(self, partition: int, counts: Counter[str]) -> None:
        """A step of `partition` ended (under exactly_once: inside its transaction): its counts join."""
        if counts:
            current = self._load(partition)
            if self.forget is not None and any(name not in current for name in counts):
                for name in [name for name in current if self.forget(name)]:
                    del current[name]
            current.update(counts)
            self._dirty.add(partition)

    def flush_due(self, partition: int, open_steps: int) -> None:
        """at_least_once, at the end of a step: write the partition's blob if it changed, unless it
        was written lately and another step of the partition is still running (it will)."""
        if partition not in self._dirty:
            return
        now = time.monotonic()
        if now - self._written_at.get(partition, 0.0) >= FLUSH_INTERVAL_S or open_steps <= 1:
            blob = self._blob(partition)
            self.table[_key(partition)] = blob
            self._written[partition] = blob
            self._written_at[partition] = now
            self._dirty.discard(partition)

    def unwritten(self, partition: int) -> tuple[Any, bytes, bytes] | None:
        """(table, key, blob) of the partition's counts when they changed since last written."""
        if partition not in self._dirty:
            return None
        return self.table, _key(partition), self._blob(partition)

    def written(self, partition: int, blob: bytes) -> None:
        """The partition's blob was written (sealed into its transaction)."""
        self._written[partition] = blob
        self._written_at[partition] = time.monotonic()
        self._dirty.discard(partition)

    def all_unwritten(self) -> Iterator[tuple[int, Any, bytes, bytes]]:
        """(partition, table, key, blob) of every partition whose counts changed since written."""
        for partition in sorted(self._dirty):
            yield partition, self.table, _key(partition), self._blob(partition)

    def written_elsewhere(self, partition: int) -> None:
        """The blob went straight to the changelog (a rebalance, a shutdown). Not `_written`:
        this worker's store gets it only when it recovers the changelog, so a partition that
        stays must still compare with the last step's blob."""
        self._written_at[partition] = time.monotonic()
        self._dirty.discard(partition)

    def on_revoked(self) -> None:
        """A rebalance: keep what was counted, to resume with it should the partition come
        back unchanged (its stored blob still the one this worker wrote last)."""
        for partition, counts in self._counts.items():
            self._stale[partition] = (counts, self._written.get(partition))
        self._counts.clear()
        self._dirty.clear()

    def value(self, partition: int, name: str) -> int:
        """One counter of a partition this worker owns: what its steps counted, written or not."""
        counts = self._counts.get(partition)
        if counts is None:
            return _decode(self.read(partition, _key(partition))).get(name, 0)
        return counts.get(name, 0)

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

    def _blob(self, partition: int) -> bytes:
        return compact_json.dumps(self._counts[partition])

    def _load(self, partition: int) -> Counter[str]:
        counts = self._counts.get(partition)
        if counts is None:
            stored = self.read(partition, _key(partition))
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
