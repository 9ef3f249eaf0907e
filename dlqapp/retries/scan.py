"""The due-time scan over one partition's parked retries (synchronous RocksDB walks)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rocksdict import Rdict, ReadOptions

from dlqapp.retries.keys import decode_parked_key, due_upper_bound

REFIRE_AFTER_MS = 120_000
"""A fired entry still parked after this long (its due message was lost to a crash of
the due agent's worker mid-flight) is fired again; the due agent ignores duplicates."""


SCAN_CHUNK = 5000


class ScanStarts:
    """Where the timer's next scan of each partition may start.

    Fired retries are deleted from the head of the table, and RocksDB keeps their
    tombstones until compaction, so a scan from the first key would wade through every
    retry fired lately. A start is a key no parked entry sorts before: a scan sets it,
    parking an earlier key lowers it, and it is dropped when the partition's store
    changes hands (after a rebalance, changelog restores may have added anything).
    """

    def __init__(self) -> None:
        self._starts: dict[int, tuple[object, bytes]] = {}

    def get(self, partition: int, db: object) -> bytes | None:
        known = self._starts.get(partition)
        return known[1] if known is not None and known[0] is db else None

    def set(self, partition: int, db: object, start: bytes) -> None:
        self._starts[partition] = (db, start)

    def lower_to(self, key: bytes) -> None:
        """A key was parked (on some partition): no start may lie above it."""
        for partition, (db, start) in self._starts.items():
            if key < start:
                self._starts[partition] = (db, key)

    def keep_only(self, partitions: Iterable[int]) -> None:
        kept = set(partitions)
        self._starts = {p: v for p, v in self._starts.items() if p in kept}

    def clear(self) -> None:
        self._starts.clear()


@dataclass(frozen=True, slots=True)
class Quiet:
    """A partition's store as its last scan found it: nothing due, nothing handed over."""

    db: object
    written: int
    """The store's RocksDB sequence number then (any write moves it)."""
    next_due: int | None
    """Its earliest retry then (None: none)."""


class QuietPartitions:
    """Partitions whose last scan found nothing due, so a tick need not walk them again.

    An idle worker's timer (50 ticks a second over every partition) cost more than anything
    else the worker did. A partition stays quiet while its store has had no write (RocksDB's
    sequence number: a park, a delete, a changelog restore) and its earliest retry is not
    yet within the horizon; the scheduler notes one only when nothing is handed over."""

    def __init__(self) -> None:
        self._known: dict[int, Quiet] = {}

    def still_quiet(self, partition: int, db: Rdict, horizon: int) -> Quiet | None:
        """What the last scan found, if the partition is still quiet at `horizon`; else None."""
        known = self._known.get(partition)
        if known is None or known.db is not db or known.written != db.latest_sequence_number():
            return None
        return known if known.next_due is None or known.next_due > horizon else None

    def note(self, partition: int, db: Rdict, written: int, next_due: int | None) -> None:
        """A scan that began at sequence number `written` found nothing due."""
        self._known[partition] = Quiet(db, written, next_due)

    def forget(self, partition: int) -> None:
        self._known.pop(partition, None)

    def clear(self) -> None:
        self._known.clear()


def scan_due(
    db: Rdict, now: int, *, start: bytes | None, fired: dict[bytes, int], batch: int
) -> tuple[list[bytes], bytes]:
    """One timer scan of a partition's parked retries (a synchronous RocksDB walk).

    Returns the keys due at `now` that were not fired (or were fired more than
    REFIRE_AFTER_MS ago), earliest first and at most `batch` of them, and where the next
    scan may start: the first key still present, or "now" when nothing due is left (a key
    parked later below that point lowers it again, see `RetryScheduler.store`).
    """
    upper = due_upper_bound(now)
    options = ReadOptions()
    options.set_iterate_upper_bound(upper)
    it = db.iter(options)
    if start is None:
        it.seek_to_first()
    else:
        it.seek(start)
    keys: list[bytes] = []
    first_present: bytes | None = None
    while it.valid() and len(keys) < batch:
        key = it.key()
        if first_present is None:
            first_present = key
        fired_at = fired.get(key)
        if fired_at is None or now - fired_at > REFIRE_AFTER_MS:
            keys.append(key)
        it.next()
    return keys, first_present if first_present is not None else upper


def next_due_after(db: Rdict, now: int) -> int | None:
    """Due time (ms) of the earliest retry parked for later than `now`, or None.

    Faust's offset record (`__faust\\0offset__`) sorts after every parked key; it decodes
    to a due time far in the future, which callers treat like "nothing soon".
    """
    it = db.iter(ReadOptions())
    it.seek(due_upper_bound(now))
    if not it.valid():
        return None
    key = it.key()
    return decode_parked_key(key)[0] if len(key) > 8 else None


def head_of_parked(db: Rdict, start: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
    """Up to `limit` (key, value) pairs from `start` (inclusive; a key no entry sorts
    before, see `ScanStarts`) or the first key, in key order: the earliest due first."""
    it = db.iter(ReadOptions())
    if start is None:
        it.seek_to_first()
    else:
        it.seek(start)
    head: list[tuple[bytes, bytes]] = []
    while it.valid() and len(head) < limit:
        head.append((it.key(), it.value()))
        it.next()
    return head
