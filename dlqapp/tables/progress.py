"""Where each partition's handling stands, committed with the outputs (exactly_once).

Faust commits consumer offsets on its own, every few seconds, after the events were acked;
dlqapp acks an event only once its transaction committed. Between the two, a `kill -9`
leaves events whose outputs are committed but whose offsets are not: the next owner is
handed them again. Their request state recognises most of them, not all (a replay, an
invalid copy, a message forwarded to its owning partition would run twice).

So each partition's transaction is sealed with a record per topic of the `progress` table:
the offset after the last event of an unbroken run of events that ended in that
transaction or before it (dlqapp.kafka.acks). A new owner recovers the table with the
other tables, and an event below its topic's progress is acked without being handled
again: its outputs are already in. This is what Kafka's own `sendOffsetsToTransaction`
gives a consumer that commits its offsets in the transaction, kept in a table of dlqapp's
so that Faust's offset commits stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dlqapp.core import compact_json
from dlqapp.kafka.acks import Ended

PositionsOf = Callable[[int], dict[str, Ended]]
"""`positions(partition)`: topic → which of its events have ended (dlqapp.kafka.acks.Acks.progress)."""

STRIKE_PREFIX = b"strike:"
MAX_RANGES = 512
"""Ranges of ended events beyond `next` kept per topic partition (a window's worth at most;
beyond it the oldest are dropped: those events are then recognised by their request state)."""


class Progress:
    """The `progress` table: what a transaction is sealed with, and what a new owner skips."""

    def __init__(
        self,
        table: Any,
        *,
        positions: PositionsOf,
        read: Callable[[int, bytes], bytes | None],
        has_strikes: Callable[[int], bool],
    ) -> None:
        """`read(partition, key)` reads the table's local store (the recovered values);
        `has_strikes(partition)` says whether it holds any `strike:` key."""
        self.table = table
        self.positions = positions
        self.read = read
        self.has_strikes = has_strikes
        self._any_strike: dict[int, bool] = {}
        self._sealed: dict[tuple[str, int], Ended] = {}
        self._recovered: dict[tuple[str, int], Ended] = {}

    def seal(self, partition: int) -> list[tuple[Any, bytes, bytes]]:
        """(table, key, value) records for `partition`'s transaction: each topic that moved."""
        records = []
        for topic, ended in self.positions(partition).items():
            key = (topic, partition)
            merged = _merge(self.recovered(topic, partition), ended)
            if merged != self._sealed.get(key):
                self._sealed[key] = merged
                records.append((self.table, topic.encode(), _encode(merged)))
        return records

    def recovered(self, topic: str, partition: int) -> Ended:
        """What the partition's previous owners committed (read once per assignment)."""
        key = (topic, partition)
        ended = self._recovered.get(key)
        if ended is None:
            ended = self._recovered[key] = _decode(self.read(partition, topic.encode()))
        return ended

    def already_done(self, topic: str, partition: int, offset: int) -> bool:
        """Whether the event at `offset` ended in a committed transaction (of any owner)."""
        return self.recovered(topic, partition).covers(offset)

    def strikes(self, topic: str, partition: int, offset: int) -> int:
        """How many transactions the record at `offset` broke (its steps failed after their first
        output, or the broker refused what they sent), as committed by any owner."""
        return _offset(self.read(partition, _strike_key(topic, offset))) if self._struck(partition) else 0

    def strike_records(
        self, partition: int, culprits: tuple[tuple[str, int, int], ...]
    ) -> list[tuple[str, bytes, bytes]]:
        """(changelog topic, key, value) records counting one more strike for each culprit."""
        records = []
        for topic, culprit_partition, offset in sorted(set(culprits)):
            if culprit_partition != partition:
                continue
            key = _strike_key(topic, offset)
            strikes = max(0, _offset(self.read(partition, key))) + 1
            self.table.put_local(partition, key, str(strikes).encode())
            records.append((self.table.changelog_topic_name, key, str(strikes).encode()))
        return records

    def clear_strike(self, topic: str, offset: int) -> None:
        """The struck record was dead-lettered (inside that step): drop its count."""
        del self.table[_strike_key(topic, offset)]

    def _struck(self, partition: int) -> bool:
        """Whether the partition holds any strike (read once per assignment; rare)."""
        struck = self._any_strike.get(partition)
        if struck is None:
            struck = self._any_strike[partition] = self.has_strikes(partition)
        return struck

    def reset(self) -> None:
        """A new assignment: read the recovered values again when next needed."""
        self._recovered.clear()
        self._sealed.clear()
        self._any_strike.clear()


def _strike_key(topic: str, offset: int) -> bytes:
    return STRIKE_PREFIX + f"{topic}:{offset}".encode()


def _merge(recovered: Ended, ended: Ended) -> Ended:
    """What both say ended: the later `next`, and every range beyond it."""
    upto = max(recovered.next, ended.next)
    ranges = sorted({*recovered.also, *ended.also})
    also: list[tuple[int, int]] = []
    for low, high in ranges:
        if high < upto:
            continue
        low = max(low, upto)
        if low == upto:
            upto = high + 1
            continue
        if also and low <= also[-1][1] + 1:
            also[-1] = (also[-1][0], max(also[-1][1], high))
        else:
            also.append((low, high))
    while also and also[0][0] <= upto:  # a range that now touches `next` joins it
        upto = max(upto, also.pop(0)[1] + 1)
    return Ended(upto, tuple(also[-MAX_RANGES:]))


def _encode(ended: Ended) -> bytes:
    return compact_json.dumps({"next": ended.next, "also": [list(r) for r in ended.also]})


def _decode(blob: bytes | None) -> Ended:
    """The stored value (`{"next": n, "also": [[low, high], ...]}`); nothing ended when absent or unreadable."""
    if not blob:
        return Ended(-1)
    try:
        doc = compact_json.loads(blob)
        return Ended(int(doc["next"]), tuple((int(low), int(high)) for low, high in doc.get("also", ())))
    except (ValueError, TypeError, KeyError):
        return Ended(-1)


def _offset(blob: bytes | None) -> int:
    try:
        return int(blob) if blob else -1
    except ValueError:
        return -1
