"""Counters: counts written in stream steps, and the unwritten rest written on a hand-back."""

from __future__ import annotations

import asyncio
import json
import weakref

from faust.streams import _current_event

from dlqapp.tables.counters import Counters
from tests.unit.fakes import FakeEvent, FakeMessage, FakeTable


def in_step(partition: int) -> FakeEvent:
    """Make the current stream step one of `partition` (what Faust's stream sets)."""
    event = FakeEvent(None, None, message=FakeMessage("stats", partition=partition))
    _current_event.set(weakref.ref(event))
    return event


def test_counts_not_yet_written_by_a_step_are_written_on_a_hand_back():
    table = FakeTable("stats")
    counters = Counters(table, open_steps=lambda partition: 2)  # another handler is running
    written: list[tuple[bytes, dict, int]] = []

    async def send(key: bytes, blob: bytes, partition: int) -> None:
        written.append((key, json.loads(blob), partition))

    event = in_step(2)
    counters.add("dlq_size")
    counters.flush_due()  # the first write of the partition
    counters.add("dlq_size", 4)
    counters.flush_due()  # too soon after the last one: left for later
    assert json.loads(table[b"p2"]) == {"dlq_size": 1}
    assert asyncio.run(counters.write_unwritten(send)) == 1
    assert written == [(b"p2", {"dlq_size": 5}, 2)]
    assert asyncio.run(counters.write_unwritten(send)) == 0, "nothing is written twice"
    del event


def test_the_last_running_handler_of_a_partition_always_writes_its_counts():
    """Issue 30: a burst's last increments stayed in memory until the partition's next
    event, and a kill -9 meanwhile lost them (totals wrong after a failover)."""
    table = FakeTable("stats")
    running = {3: 3}
    counters = Counters(table, open_steps=lambda partition: running[partition])
    event = in_step(3)
    counters.add("dlq_size")
    counters.flush_due()  # the first write of the partition
    counters.add("dlq_size")
    counters.flush_due()  # two more handlers still running: they will write
    assert json.loads(table[b"p3"]) == {"dlq_size": 1}
    running[3] = 1
    counters.add("dlq_size")
    counters.flush_due()  # the last one of the burst: written at once
    assert json.loads(table[b"p3"]) == {"dlq_size": 3}
    del event
