"""Counters: counts moved in stream steps, joined when a step ends, written by the rules of
each guarantee, and the unwritten rest written on a hand-back."""

from __future__ import annotations

import json

from dlqapp.tables.counters import Counters
from dlqapp.tables.step import Step, StepContext
from tests.unit.fakes import FakeTable


def counted(counters: Counters, context: StepContext, partition: int, name: str, amount: int = 1) -> None:
    """One step of `partition` that counts `amount` of `name`, then ends (its counts join)."""
    step = Step(partition)
    token = context.enter(step)
    counters.add(name, amount)
    context.leave(token)
    counters.merge(partition, step.counts)


def test_counts_not_yet_written_by_a_step_are_written_on_a_hand_back():
    table, context = FakeTable("stats"), StepContext()
    counters = Counters(table, context, read=lambda partition, key: table.get(key))
    counted(counters, context, 2, "dlq_size")
    token = context.enter(Step(2))
    counters.flush_due(2, open_steps=2)  # the first write of the partition
    counted(counters, context, 2, "dlq_size", 4)
    counters.flush_due(2, open_steps=2)  # too soon after the last one, another step runs: later
    context.leave(token)
    assert json.loads(table[b"p2"]) == {"dlq_size": 1}
    unwritten = list(counters.all_unwritten())
    assert [(p, key, json.loads(blob)) for p, _, key, blob in unwritten] == [(2, b"p2", {"dlq_size": 5})]
    counters.written_elsewhere(2)
    assert list(counters.all_unwritten()) == [], "nothing is written twice"


def test_the_last_running_step_of_a_partition_always_writes_its_counts():
    """Issue 30: a burst's last increments stayed in memory until the partition's next
    event, and a kill -9 meanwhile lost them (totals wrong after a failover)."""
    table, context = FakeTable("stats"), StepContext()
    counters = Counters(table, context, read=lambda partition, key: table.get(key))
    counted(counters, context, 3, "dlq_size")
    counters.flush_due(3, open_steps=3)  # the first write of the partition
    counted(counters, context, 3, "dlq_size")
    counters.flush_due(3, open_steps=3)  # two more steps still running: they will write
    assert json.loads(table[b"p3"]) == {"dlq_size": 1}
    counted(counters, context, 3, "dlq_size")
    counters.flush_due(3, open_steps=1)  # the last one of the burst: written at once
    assert json.loads(table[b"p3"]) == {"dlq_size": 3}


def test_sealing_takes_a_partitions_counts_once_and_only_when_they_changed():
    """exactly_once: what a transaction is sealed with (dlqapp.tables.steps)."""
    table, context = FakeTable("stats"), StepContext()
    counters = Counters(table, context, read=lambda partition, key: table.get(key))
    assert counters.unwritten(0) is None
    counted(counters, context, 0, "received", 2)
    stats, key, blob = counters.unwritten(0)
    assert stats is table and key == b"p0" and json.loads(blob) == {"received": 2}
    counters.written(0, blob)
    assert counters.unwritten(0) is None
    counted(counters, context, 0, "succeeded")
    assert json.loads(counters.unwritten(0)[2]) == {"received": 2, "succeeded": 1}


def test_a_partition_starts_from_its_stored_counts():
    table, context = FakeTable("stats"), StepContext()
    table[b"p1"] = b'{"received": 10}'
    counters = Counters(table, context, read=lambda partition, key: table.get(key))
    counted(counters, context, 1, "received")
    assert counters.total([1], lambda partition, key: None)["received"] == 11
