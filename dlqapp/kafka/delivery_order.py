"""Records reach the agents in offset order, each once per assignment, none skipped.

Faust's consumer hands records to the agents in one loop, and under rebalances that loop
can skip records: a batch fetched before a partition was paused is dropped for that
partition (the fetch position already past it), a delivery cancelled by a rebalance is
lost, a record fetched before a rebalance arrives after the new assignment's seek. Faust
then sees a jump in offsets, calls the skipped range a gap, and commits past it: requests
that were never handled (faust #216, #221, #606). The latency chaos run lost thousands.

`DeliveryOrder` is the rule dlqapp's consumer (dlqapp.kafka.faust_consumer) applies to
every record of a topic an agent acks, instead:

- a partition is delivered from only after its seek in the current assignment (`start`);
- the record handed over is always the next offset expected, or a repeat that is dropped;
- a jump is never a gap at first: the partition is rewound to the offset expected and the
  records fetched before the rewind are dropped; so is a partition whose fetch position is
  past the offset expected while the consumer is idle (a skipped tail shows no jump);
- only a jump that every fetch after a rewind repeats (`GAP_AFTER_REWINDS` times) is a real
  gap in the log (retention, compaction, transaction markers): then, and only then, it may
  be committed past.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable, Mapping
from typing import Generic, TypeVar

P = TypeVar("P", bound=Hashable)
"""A partition (Faust's `TP` in the consumer)."""


class Verdict(enum.Enum):
    DELIVER = "deliver"
    """The offset expected: hand it to the agent."""
    DROP = "drop"
    """Already handed over, fetched before the last seek, or the partition is not sought yet."""
    REWIND = "rewind"
    """Records before this one were skipped: seek back to the offset expected, drop this one."""
    GAP = "gap"
    """Fetches after rewinds start at the same record past the expected offset, again and
    again: the log has nothing in between (retention, compaction, transaction markers)."""


class DeliveryOrder(Generic[P]):
    """The next offset each partition may hand over, and the last seek of each.

    `batch` numbers the fetches the consumer hands out, in order: a record of a fetch
    numbered no higher than a seek's was fetched before the seek.
    """

    GAP_AFTER_REWINDS = 3
    """Rewinds in a row that must end at the same record before the records skipped count as a gap."""

    def __init__(self) -> None:
        self._next: dict[P, int] = {}
        self._sought: dict[P, tuple[int, int, int | None, int]] = {}
        """Per partition: (offset sought, fetch number then, record that caused it, times in a row)."""
        self._idle: dict[P, tuple[int, int, int]] = {}
        """Per partition: (offset expected, fetch position, idle rewinds in a row that ended there)."""

    def start(self, tp: P, offset: int, batch: int) -> None:
        """The partition is sought to `offset` in this assignment while fetch `batch` is handed out."""
        self._next[tp] = offset
        self._sought[tp] = (offset, batch, None, 0)
        self._idle.pop(tp, None)

    def forget(self, tps: Iterable[P]) -> None:
        """The partitions were revoked: nothing of theirs is delivered until the next `start`."""
        for tp in tps:
            self._next.pop(tp, None)
            self._sought.pop(tp, None)
            self._idle.pop(tp, None)

    def expected(self, tp: P) -> int | None:
        """The offset the partition hands over next (None before its seek)."""
        return self._next.get(tp)

    def decide(self, tp: P, offset: int, batch: int) -> Verdict:
        """What to do with the record at `offset`, from fetch number `batch`."""
        expected = self._next.get(tp)
        if expected is None or offset < expected:
            return Verdict.DROP
        if offset == expected:
            return Verdict.DELIVER
        sought = self._sought.get(tp)
        if sought is not None and sought[0] == expected:
            if batch <= sought[1]:
                return Verdict.DROP
            if offset == sought[2] and sought[3] + 1 >= self.GAP_AFTER_REWINDS:
                return Verdict.GAP
        return Verdict.REWIND

    def rewinding(self, tp: P, offset: int, batch: int) -> int | None:
        """Note a rewind caused by the record at `offset` of fetch `batch`; returns the offset to
        seek to (None: the partition was revoked meanwhile, nothing to seek)."""
        expected = self._next.get(tp)
        if expected is None:
            return None
        sought = self._sought.get(tp)
        repeats = sought[3] + 1 if sought is not None and sought[0] == expected and sought[2] == offset else 1
        self._sought[tp] = (expected, batch, offset, repeats)
        return expected

    def behind(self, positions: Mapping[P, int]) -> list[P]:
        """Partitions whose fetch position is past the offset expected while nothing is being
        handed out: records were taken from the fetcher and never delivered (the tail of a
        partition, where no later record shows a jump). Each needs a rewind."""
        return [tp for tp, position in positions.items() if tp in self._next and position > self._next[tp]]

    def idle_check(self, positions: Mapping[P, int]) -> list[tuple[P, Verdict, int]]:
        """(partition, verdict, offset expected) for each partition `behind`: REWIND, or GAP
        once idle rewinds ended `GAP_AFTER_REWINDS` times in a row at the same position with
        nothing delivered (the log's tail holds nothing to deliver: a transaction's commit
        marker, aborted records); the partition then expects that position."""
        verdicts = []
        for tp in self.behind(positions):
            expected, position = self._next[tp], positions[tp]
            seen = self._idle.get(tp)
            times = seen[2] + 1 if seen is not None and seen[:2] == (expected, position) else 1
            if times >= self.GAP_AFTER_REWINDS:
                self._idle.pop(tp, None)
                self._next[tp] = position
                verdicts.append((tp, Verdict.GAP, expected))
            else:
                self._idle[tp] = (expected, position, times)
                verdicts.append((tp, Verdict.REWIND, expected))
        return verdicts

    def delivered(self, tp: P, offset: int) -> None:
        """The record at `offset` reached the agents: the next one is expected."""
        if tp in self._next:
            self._next[tp] = offset + 1
            self._idle.pop(tp, None)
