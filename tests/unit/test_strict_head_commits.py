"""Commits never pass an offset that was not handled (dlqapp.worker.faust_compat.StrictHeadCommits),
on Faust's own commit arithmetic (its `Consumer._new_offset`) with in-memory state."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from faust.transport.consumer import Consumer as FaustConsumer
from faust.types import TP
from intervaltree import IntervalTree

from dlqapp.worker.faust_compat import StrictHeadCommits

INPUT = TP("input", 0)


class FaustCommitState:
    """The members Faust's `_new_offset` reads, and a recording seek."""

    _new_offset = FaustConsumer._new_offset

    def __init__(self, committed: int | None) -> None:
        self._acked = defaultdict(list)
        self._acked_index = defaultdict(set)
        self._gap = defaultdict(IntervalTree)
        self._committed_offset = defaultdict(lambda: None)
        self._committed_offset[INPUT] = committed
        self.sought: list[tuple[TP, int]] = []

    def ack(self, *offsets: int) -> None:
        for offset in offsets:
            self._acked[INPUT].append(offset)
            self._acked_index[INPUT].add(offset)

    async def seek(self, tp: TP, offset: int) -> None:
        self.sought.append((tp, offset))


class Strict(StrictHeadCommits, FaustCommitState):
    def __init__(self, committed: int | None, record_there: bool | None) -> None:
        super().__init__(committed)
        self.probed: list[int] = []

        async def probe(tp: TP, offset: int) -> bool | None:
            self.probed.append(offset)
            return record_there

        self.head_probe = probe



def test_faust_alone_commits_past_a_record_at_the_committed_offset_that_was_never_acked():
    """What StrictHeadCommits exists for (re-check after a Faust upgrade)."""
    faust = FaustCommitState(committed=10)
    faust.ack(11, 12)
    assert faust._new_offset(INPUT) == 13  # offset 10 was never handled


def test_a_record_skipped_at_the_committed_offset_is_sought_back_and_committed_only_once_handled():
    async def run():
        consumer = Strict(committed=10, record_there=True)
        consumer.ack(11, 12)
        assert consumer._new_offset(INPUT) is None
        await asyncio.sleep(0.01)  # the probe finds a record at 10: seek back to it
        assert consumer.probed == [10] and consumer.sought == [(INPUT, 10)]
        assert consumer._new_offset(INPUT) is None  # still not handled
        consumer.ack(10)  # handed over again and handled
        assert consumer._new_offset(INPUT) == 13
        assert consumer.probed == [10]

    asyncio.run(run())


def test_an_offset_without_a_record_is_committed_over_once_the_probe_says_so():
    async def run():
        consumer = Strict(committed=10, record_there=False)  # e.g. a transaction marker
        consumer.ack(11, 12)
        assert consumer._new_offset(INPUT) is None
        await asyncio.sleep(0.01)
        assert consumer._new_offset(INPUT) == 13 and consumer.sought == []

    asyncio.run(run())


def test_a_probe_that_cannot_tell_is_asked_again_and_nothing_is_committed_meanwhile():
    async def run():
        consumer = Strict(committed=0, record_there=None)  # offset 0: Faust's check skips it entirely
        consumer.ack(1, 2)
        assert consumer._new_offset(INPUT) is None
        await asyncio.sleep(0.01)
        assert consumer._new_offset(INPUT) is None
        await asyncio.sleep(0.01)
        assert consumer.probed == [0, 0] and consumer.sought == []

    asyncio.run(run())


def test_a_run_that_starts_at_the_committed_offset_commits_as_faust_does_without_a_probe():
    async def run():
        consumer = Strict(committed=10, record_there=True)
        consumer.ack(10, 11, 12, 14)
        assert consumer._new_offset(INPUT) == 13 and consumer.probed == []

    asyncio.run(run())
