"""Running counts for `/dlq/stats/`, `/metrics` and budgets, kept as events happen.

Each partition's counts live in the `stats` table, so they survive restarts and move with
their partition; a read costs the same with a thousand or a million requests in the tables.
Most are in one blob per partition (key `p<partition>`). Spend counters (`spend|…`: one per
tenant and model and UTC window) each have a key of their own (`p<partition>|<name>`), so a
write carries the spend that moved, not that of every tenant the partition has seen this
month: in one blob, 5,000 tenants made every commit rewrite tens of kilobytes.

Counts move only inside a stream step (`add`); a step's counts join its partition's when it
ends (dlqapp.tables.steps), and what changed is written:

- under exactly_once, into the partition's transaction when it is sealed, so the counts
  commit with the outputs and states that moved them: after a `kill -9` they agree with
  the topics exactly;
- under at_least_once, at the end of a step, at most every `FLUSH_INTERVAL_S` per partition
  while other steps of the partition are running (the last step of a burst always writes):
  a crash can lose only the increments of the last interval of a busy partition.

The blob is written with every write of its partition (a spend always moves `cost_nusd` in
it too), so a stored blob equal to the last one this worker wrote says nobody wrote the
partition since (`on_revoked`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from dlqapp.core import compact_json
from dlqapp.core.budgets import SPEND
from dlqapp.kafka.faust_tables import active_partitions, keys_with_prefix, partition_db, read_partition

FLUSH_INTERVAL_S = 0.25
DETACHED = SPEND + "|"
"""Counters whose names start with this are kept under keys of their own (module doc)."""

Record = tuple[bytes, bytes | None]
"""A stats table write: (key, value); None deletes the key."""


class CurrentStep(Protocol):
    """Where the current step's counts are kept (dlqapp.tables.steps.StepContext)."""

    def required(self, what: str) -> Any: ...


def _key(partition: int) -> bytes:
    return f"p{partition}".encode()


def _prefix(partition: int) -> bytes:
    return f"p{partition}|".encode()


@dataclass
class _Partition:
    """One partition's counts: the blob's, the detached ones, and what changed since written."""

    core: Counter[str] = field(default_factory=Counter)
    detached: Counter[str] = field(default_factory=Counter)
    changed: set[str] = field(default_factory=set)
    """Detached names changed (or forgotten) since written."""
    dirty: bool = False

    def get(self, name: str) -> int:
        return (self.detached if name.startswith(DETACHED) else self.core).get(name, 0)


class Counters:
    """Per-partition counters: `add` in a stream step; the steps write them (module doc)."""

    def __init__(
        self,
        table: Any,
        steps: CurrentStep,
        *,
        observe: Callable[[str, int], None] = lambda name, amount: None,
        read: Callable[[int, bytes], bytes | None] | None = None,
        scan: Callable[[int, bytes], Iterable[Record]] | None = None,
        forget: Callable[[str], bool] | None = None,
    ) -> None:
        """`observe(name, amount)` sees every counted change (the health page's minute rates);
        `read(partition, key)` reads a stored key of a partition (default: its RocksDB) and
        `scan(partition, prefix)` its keys starting with `prefix`, with their values;
        `forget(name)`: a counter no longer needed (a past spend window), dropped whenever a
        step counts a name the partition did not have yet."""
        self.table = table
        self.steps = steps
        self.observe = observe
        self.read = read or (lambda partition, key: read_partition(table, partition, key))
        self.scan = scan or (lambda partition, prefix: _scan(table, partition, prefix))
        self.forget = forget
        self._parts: dict[int, _Partition] = {}
        self._written_at: dict[int, float] = {}
        self._written: dict[int, bytes] = {}
        self._stale: dict[int, tuple[_Partition, bytes | None]] = {}

    def add(self, name: str, amount: int = 1) -> None:
        """Count `amount` more of `name` in the current step (its partition's once it ends)."""
        self.steps.required(f"counting {name}").counts[name] += amount
        self.observe(name, amount)

    def merge(self, partition: int, counts: Counter[str]) -> None:
        """A step of `partition` ended (under exactly_once: inside its transaction): its counts join."""
        if not counts:
            return
        part = self._load(partition)
        for name, amount in counts.items():
            if name.startswith(DETACHED):
                if name not in part.detached and self.forget is not None:
                    self._forget(part)
                part.detached[name] += amount
                part.changed.add(name)
            else:
                part.core[name] += amount
                if not part.core[name]:
                    del part.core[name]  # 0 and absent read the same: a label counted up and down leaves nothing
        part.dirty = True

    def _forget(self, part: _Partition) -> None:
        assert self.forget is not None
        for name in [name for name in part.detached if self.forget(name)]:
            del part.detached[name]
            part.changed.add(name)

    def flush_due(self, partition: int, open_steps: int) -> None:
        """at_least_once, at the end of a step: write the partition's changes if any, unless it
        was written lately and another step of the partition is still running (it will)."""
        part = self._parts.get(partition)
        if part is None or not part.dirty:
            return
        if time.monotonic() - self._written_at.get(partition, 0.0) >= FLUSH_INTERVAL_S or open_steps <= 1:
            records = self.unwritten(partition)
            for table, key, value in records:
                table[key] = value
            self.written(partition, records)

    def unwritten(self, partition: int) -> list[tuple[Any, bytes, bytes | None]]:
        """(table, key, value) of each write the partition's counts need (none when unchanged)."""
        part = self._parts.get(partition)
        if part is None or not part.dirty:
            return []
        return [(self.table, key, value) for key, value in self._records(partition, part)]

    def written(self, partition: int, records: list[tuple[Any, bytes, bytes | None]]) -> None:
        """The partition's `unwritten` records were written (sealed into its transaction)."""
        blob = next((value for _, key, value in records if key == _key(partition)), None)
        if blob is not None:
            self._written[partition] = blob
        self.written_elsewhere(partition)

    def all_unwritten(self) -> Iterator[tuple[int, Any, bytes, bytes | None]]:
        """(partition, table, key, value) of every write that partitions' counts need."""
        for partition in sorted(self._parts):
            for table, key, value in self.unwritten(partition):
                yield partition, table, key, value

    def written_elsewhere(self, partition: int) -> None:
        """The records went out (or straight to the changelog: a rebalance, a shutdown). Only
        `written` notes the blob: after straight to the changelog this worker's store gets it
        when it recovers the changelog, so a partition that stays must compare with the last
        step's blob."""
        self._written_at[partition] = time.monotonic()
        part = self._parts.get(partition)
        if part is not None:
            part.dirty = False
            part.changed.clear()

    def on_revoked(self) -> None:
        """A rebalance: keep what was counted, to resume with it should the partition come
        back unchanged (its stored blob still the one this worker wrote last)."""
        for partition, part in self._parts.items():
            self._stale[partition] = (part, self._written.get(partition))
        self._parts.clear()

    def value(self, partition: int, name: str) -> int:
        """One counter of a partition this worker owns: what its steps counted, written or not."""
        part = self._parts.get(partition)
        if part is not None:
            return part.get(name)
        if name.startswith(DETACHED):
            value = self.read(partition, _prefix(partition) + name.encode())
            if value is not None:
                return count_of(value)  # else still in the blob, should it predate keys of their own
        return _decode(self.read(partition, _key(partition))).get(name, 0)

    def spend(self, partition: int) -> Counter[str]:
        """The spend counters of a partition this worker owns, written or not. A read only:
        a partition not loaded yet stays so (loading it outside a step, before its changelog
        was recovered, would make the next step count on top of a half-recovered store)."""
        part = self._parts.get(partition)
        if part is not None:
            return Counter(part.detached)
        return self._stored(partition, self.read(partition, _key(partition))).detached

    def total(self, partitions: Iterable[int], read: Any) -> Counter[str]:
        """The sum of the blobs' counters over `partitions` (spend counters: SpendView);
        `read(partition, key)` reads a stored blob outside a stream."""
        total: Counter[str] = Counter()
        for partition in partitions:
            part = self._parts.get(partition)
            total.update(part.core if part is not None else _decode(read(partition, _key(partition))))
        return total

    def total_of(self, table: Any) -> Counter[str]:
        """The sum over the partitions of `table` this worker actively owns."""
        return self.total(active_partitions(table), lambda partition, key: read_partition(table, partition, key))

    def _records(self, partition: int, part: _Partition) -> list[Record]:
        """The changed spend keys, then the blob: a reader of the changelog between the two
        (dlqapp.tables.spend_view) never sees a blob whose spend moved to keys not yet read."""
        prefix = _prefix(partition)
        records: list[Record] = []
        for name in sorted(part.changed):
            value = part.detached.get(name)
            records.append((prefix + name.encode(), None if value is None else str(value).encode()))
        records.append((_key(partition), compact_json.dumps(part.core)))
        return records

    def _load(self, partition: int) -> _Partition:
        part = self._parts.get(partition)
        if part is None:
            stored = self.read(partition, _key(partition))
            kept, written = self._stale.pop(partition, (None, None))
            if kept is not None and stored == written:
                part = kept  # nobody else counted meanwhile: keep the increments not yet written
                part.dirty = True
            else:
                part = self._stored(partition, stored)
            self._parts[partition] = part
        return part

    def _stored(self, partition: int, blob: bytes | None) -> _Partition:
        part = _Partition(core=_decode(blob))
        older = [name for name in part.core if name.startswith(DETACHED)]  # kept in the blob before
        for name in older:
            part.detached[name] = part.core.pop(name)
        prefix = _prefix(partition)
        for key, value in self.scan(partition, prefix):
            part.detached[key[len(prefix) :].decode()] = count_of(value)
        part.changed.update(older)  # moved to keys of their own at the next write
        part.dirty = bool(older)
        return part


def _scan(table: Any, partition: int, prefix: bytes) -> list[Record]:
    db = partition_db(table, partition)
    return [(key, db.get(key)) for key in keys_with_prefix(db, prefix, 1 << 30)]


def count_of(value: bytes | None) -> int:
    """A spend counter's stored value (decimal digits); 0 when absent or not a number."""
    try:
        return int(value) if value else 0
    except ValueError:
        return 0


def _decode(blob: bytes | None) -> Counter[str]:
    if not blob:
        return Counter()
    try:
        data = compact_json.loads(blob)
    except ValueError:
        return Counter()
    return Counter({k: v for k, v in data.items() if isinstance(v, int)}) if isinstance(data, dict) else Counter()


def grouped(total: Counter[str], prefix: str) -> dict[str, int]:
    """`{label: n}` of the counters named `<prefix>|<label>` (zeroes left out)."""
    start = prefix + "|"
    return {name[len(start) :]: n for name, n in total.items() if name.startswith(start) and n}
