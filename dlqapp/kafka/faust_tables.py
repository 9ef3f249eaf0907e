"""The Faust table and RocksDB internals dlqapp relies on: partitions' stores, scans, offsets.

Each helper names the private member it touches and why. Checked against faust-streaming
0.15.3 and rocksdict 0.3; read these first after an upgrade.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rocksdict import ReadOptions


def partition_db(table: Any, partition: int) -> Any:
    """The `rocksdict.Rdict` of one table partition (`Store._db_for_partition`): Faust has no range scan."""
    return table.data._db_for_partition(partition)


def is_offset_record(table: Any, key: bytes) -> bool:
    """Faust keeps each partition's changelog offset inside the partition's RocksDB (`Store.offset_key`)."""
    return key == table.data.offset_key


def keys_with_prefix(db: Any, prefix: bytes, limit: int) -> Iterator[bytes]:
    """Up to `limit` keys of `db` that start with `prefix`, in key order."""
    it = db.iter(ReadOptions())
    it.seek(prefix)
    found = 0
    while it.valid() and found < limit:
        key = it.key()
        if not key.startswith(prefix):
            return
        yield key
        found += 1
        it.next()


def active_partitions(table: Any) -> list[int]:
    """Partitions of `table` this worker actively owns (standbys excluded).

    Read by topic from the assignor's current assignment (replaced, never changed in place,
    at each rebalance): its `assigned_actives()` builds a set of every partition of every
    topic assigned, and the retry timer asks twice a tick, 100 times a second (1-2 % of a
    core at 12 partitions, with nothing to do)."""
    changelog = table.changelog_topic.get_topic_name()
    return sorted(table.app.assignor._assignment.actives.get(changelog, ()))


def read_partition(table: Any, partition: int, key: bytes) -> bytes | None:
    """One key of one table partition, read outside a stream (no stale standby copy)."""
    return partition_db(table, partition).get(key)


def scan_chunk(db: Any, after: bytes | None, limit: int, values: bool = True) -> list[tuple[bytes, Any]]:
    """Up to `limit` (key, value) pairs after `after` (exclusive), in key order (value None unless `values`)."""
    it = db.iter(ReadOptions())
    if after is None:
        it.seek_to_first()
    else:
        it.seek(after)
        if it.valid() and it.key() == after:
            it.next()
    chunk: list[tuple[bytes, Any]] = []
    while it.valid() and len(chunk) < limit:
        chunk.append((it.key(), it.value() if values else None))
        it.next()
    return chunk


def values_newest_first(table: Any, partition: int) -> Iterator[bytes]:
    """The values of one table partition in descending key order (a lazy RocksDB walk)."""
    it = partition_db(table, partition).iter(ReadOptions())
    it.seek_to_last()
    while it.valid():
        if not is_offset_record(table, it.key()):
            yield it.value()
        it.prev()


def local_partition_db(table: Any, partition: int) -> Any:
    """The RocksDB of one table partition (`Store._db_for_partition`), or None when the
    table's store is not RocksDB (the in-memory store of tests)."""
    db_for_partition = getattr(table.data, "_db_for_partition", None)
    return None if db_for_partition is None else db_for_partition(partition)


def set_persisted_offset(table: Any, partition: int, offset: int) -> None:
    """Note in the partition's RocksDB how far its changelog is applied (`Store.set_persisted_offset`,
    which Faust calls itself after every changelog send, from `Collection._on_changelog_sent`)."""
    from faust.types import TP

    table.data.set_persisted_offset(TP(table.changelog_topic_name, partition), offset)


def producer_of(table: Any) -> Any:
    """Faust's producer (`App.producer`), whose `send` hands a record to aiokafka and returns its future."""
    return table.app.producer


async def send_to_changelog(table: Any, key: bytes, value: bytes, partition: int) -> None:
    """Write `key` = `value` of one table partition straight to its changelog, outside a stream.

    Faust writes a table only inside a stream step (the event names the partition); this is
    for the moment no step is left (a rebalance, a shutdown). The worker's own store is not
    updated: the partition's next owner, this worker included, reads it when it recovers.
    """
    await table.app.producer.send_and_wait(table.changelog_topic.get_topic_name(), key, value, partition, None, None)
