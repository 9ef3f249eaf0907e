"""The one ack rule (dlqapp.kafka.acks) and the progress it reports, with random histories."""

from __future__ import annotations

import asyncio
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dlqapp.kafka.acks import Acks, Ended
from dlqapp.tables.progress import Progress, _decode, _encode, _merge
from tests.unit.processing.flow_fakes import FakeEvent


def test_events_are_acked_in_offset_order_only_once_their_commit_resolved():
    async def run() -> None:
        acked: list[int] = []
        acks = Acks(lambda event: None)
        tickets = [acks.track(FakeEvent(offset, acked)) for offset in (5, 6, 7)]
        commit = asyncio.get_running_loop().create_future()
        acks.ended(tickets[1], None)  # nothing to commit, but 5 is still running
        acks.ended(tickets[0], commit)
        assert acked == []
        assert acks.progress(0) == {"input": Ended(7)}  # 5 and 6 ended: 7 is next
        commit.set_result(None)
        await asyncio.sleep(0)
        assert acked == [5, 6]

    asyncio.run(run())


def test_a_failed_commit_never_acks():
    async def run() -> None:
        acked: list[int] = []
        acks = Acks(lambda event: None)
        ticket = acks.track(FakeEvent(1, acked))
        commit = asyncio.get_running_loop().create_future()
        acks.ended(ticket, commit)
        commit.set_exception(RuntimeError("fenced"))
        await asyncio.sleep(0)
        assert acked == []

    asyncio.run(run())


def test_a_hand_back_stops_acks_after_it_and_hands_back_what_ends_later_but_progress_keeps_what_ended():
    handed: list[int] = []
    acked: list[int] = []
    acks = Acks(lambda event: handed.append(event.offset))
    tickets = [acks.track(FakeEvent(offset, acked)) for offset in range(10, 15)]
    acks.ended(tickets[0], None)
    acks.ended(tickets[2], None)  # ended behind a running one
    acks.hand_back(tickets[1])  # a rebalance gives 11 back
    acks.ended(tickets[3], None)  # ends after the hand-back
    assert acked == [10] and handed == [11, 12, 13]  # 12 and 13 can never be acked now
    assert acks.progress(0) == {"input": Ended(11, ((12, 13),))}
    assert acks.hand_back_running() == 1 and handed == [11, 12, 13, 14]


def test_a_ticket_of_an_earlier_assignment_touches_nothing_of_the_next():
    acked: list[int] = []
    acks = Acks(lambda event: None)
    old = acks.track(FakeEvent(3, acked))
    acks.reset()  # the next assignment
    new = acks.track(FakeEvent(1, acked))
    acks.hand_back(old)
    acks.ended(new, None)
    assert acked == [1]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 40))
def test_progress_covers_exactly_the_ended_events_in_any_order(seed, count):
    """Random completion orders and hand-backs: what progress says ended is what ended."""
    rng = random.Random(seed)
    acks = Acks(lambda event: None)
    offsets = sorted(rng.sample(range(100, 200), count))  # gaps: transaction markers, compaction
    tickets = [acks.track(FakeEvent(offset, [])) for offset in offsets]
    ended: set[int] = set()
    for ticket in rng.sample(tickets, len(tickets)):
        if rng.random() < 0.15:
            acks.hand_back(ticket)
        elif rng.random() < 0.8:
            acks.ended(ticket, None)
            ended.add(ticket.offset)
    progress = acks.progress(0)["input"]
    for offset in offsets:
        assert progress.covers(offset) == (offset in ended), (offset, progress, ended)
    assert progress.covers(99)  # before the first delivered: done by an earlier owner
    stored = _decode(_encode(progress))
    assert stored == progress


def test_sealing_merges_with_what_an_earlier_owner_committed_and_never_goes_back():
    store: dict[bytes, bytes] = {b"input": _encode(Ended(50, ((55, 60),)))}

    class Table:
        changelog_topic_name = "app-progress-changelog"

        def put_local(self, partition, key, value):
            store[key] = value

    acks = Acks(lambda event: None)
    progress = Progress(
        Table(), positions=acks.progress, read=lambda p, key: store.get(key), has_strikes=lambda p: False
    )
    first = acks.track(FakeEvent(45, []))  # redelivered from the committed offset
    assert progress.already_done("input", 0, 45) and progress.already_done("input", 0, 57)
    assert not progress.already_done("input", 0, 52)
    acks.ended(first, None)  # skipped at the door
    (record,) = progress.seal(0)
    assert _decode(record[2]) == Ended(50, ((55, 60),))  # not back to 46
    assert progress.seal(0) == []  # nothing moved


def test_merge_joins_ranges_that_reach_next():
    assert _merge(Ended(10, ((12, 14),)), Ended(11, ((15, 16),))) == Ended(11, ((12, 16),))
    assert _merge(Ended(10, ((12, 14), (20, 20))), Ended(12)) == Ended(15, ((20, 20),))
    assert _merge(Ended(10, ((11, 14),)), Ended(3)) == Ended(10, ((11, 14),))
    assert _merge(Ended(-1), Ended(3, ((5, 9),))) == Ended(3, ((5, 9),))


# -- records read ahead of their turn (dlqapp.kafka.tail_read) ------------------------------------------


def test_a_record_read_ahead_is_sealed_once_ended_and_acked_only_through_the_consumers_own_event():
    async def run() -> None:
        acked: list[int] = []
        acks = Acks(lambda event: None)
        first = acks.track(FakeEvent(10, acked))
        assert acks.track_ahead(FakeEvent(9, acked), ("input", 0), 9) is None  # the door is past it
        assert acks.track_ahead(FakeEvent(12, acked), ("input", 1), 12) is None  # nothing came through partition 1
        ahead = acks.track_ahead(FakeEvent(12, acked), ("input", 0), 12)
        assert ahead is not None and acks.track_ahead(FakeEvent(12, acked), ("input", 0), 12) is None
        assert acks.progress(0) == {"input": Ended(10)}  # running: not sealed yet
        commit = asyncio.get_running_loop().create_future()
        acks.ended(ahead, commit)
        assert acks.progress(0) == {"input": Ended(10, ((12, 12),))}  # in the transaction: sealed with it
        acks.ended(first, None)
        eleven = acks.track(FakeEvent(11, acked))
        twelve = acks.track(FakeEvent(12, acked))
        assert twelve.follows is ahead and eleven.follows is None
        acks.ended(eleven, None)
        assert acked == [10, 11] and acks.progress(0) == {"input": Ended(13)}
        commit.set_result(None)
        await asyncio.sleep(0)
        assert acked == [10, 11, 12]  # the consumer's own event, once the ahead step committed

    asyncio.run(run())


def test_the_consumers_event_that_arrives_while_the_ahead_step_runs_ends_with_it_or_goes_back_with_it():
    acked: list[int] = []
    handed: list[int] = []
    acks = Acks(lambda event: handed.append(event.offset))
    acks.ended(acks.track(FakeEvent(1, acked)), None)
    done, back = (acks.track_ahead(FakeEvent(o, acked), ("input", 0), o) for o in (2, 3))
    assert done is not None and back is not None
    two, three = acks.track(FakeEvent(2, acked)), acks.track(FakeEvent(3, acked))
    assert two.follows is done and three.follows is back and acked == [1]
    acks.ended(done, None)
    assert acked == [1, 2]
    acks.hand_back(back)  # the ahead step was released (a rebalance): the consumer's event goes back
    assert handed == [3] and acks.progress(0) == {"input": Ended(3)}


def test_a_released_ahead_ticket_leaves_its_offset_to_the_door():
    acked: list[int] = []
    acks = Acks(lambda event: None)
    acks.track(FakeEvent(1, acked))
    ahead = acks.track_ahead(FakeEvent(5, acked), ("input", 0), 5)
    assert ahead is not None
    acks.hand_back(ahead)  # never started (the window was closing)
    five = acks.track(FakeEvent(5, acked))
    assert five.follows is None  # handled by the door as any other


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32), st.integers(2, 40))
def test_with_records_read_ahead_every_event_is_acked_once_in_order_and_progress_is_what_ended(seed, count):
    """Random histories: some records are read ahead of the door, steps end in any order, the
    door comes through interleaved; acks stay contiguous, each event acked once, only after
    it (or the read ahead of it) ended, and progress covers exactly what ended."""
    rng = random.Random(seed)
    acked: list[int] = []
    acks = Acks(lambda event: None)
    offsets = list(range(100, 100 + count))
    ended: set[int] = set()
    running = []
    door = 0
    acks.ended(acks.track(FakeEvent(99, acked)), None)
    ended.add(99)
    while door < len(offsets) or running:
        roll = rng.random()
        if roll < 0.3 and door < len(offsets):
            event = FakeEvent(offsets[door], acked)
            ticket = acks.track(event)
            door += 1
            if ticket.follows is None:
                running.append(ticket)
        elif roll < 0.5 and door < len(offsets):
            offset = rng.choice(offsets[door:])
            ahead = acks.track_ahead(FakeEvent(offset, acked), ("input", 0), offset)
            if ahead is not None:
                running.append(ahead)
        elif running:
            ticket = running.pop(rng.randrange(len(running)))
            acks.ended(ticket, None)
            ended.add(ticket.offset)
        progress = acks.progress(0)["input"]
        for offset in [99, *offsets]:
            assert progress.covers(offset) == (offset in ended), (offset, progress, sorted(ended))
        assert acked == list(range(99, 99 + len(acked)))  # contiguous, in order, each once
        assert all(offset in ended for offset in acked)
    assert acked == [99, *offsets]
