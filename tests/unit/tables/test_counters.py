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
    assert counters.unwritten(0) == []
    counted(counters, context, 0, "received", 2)
    sealed = counters.unwritten(0)
    [(stats, key, blob)] = sealed
    assert stats is table and key == b"p0" and json.loads(blob) == {"received": 2}
    counters.written(0, sealed)
    assert counters.unwritten(0) == []
    counted(counters, context, 0, "succeeded")
    assert json.loads(counters.unwritten(0)[0][2]) == {"received": 2, "succeeded": 1}


def test_a_partition_starts_from_its_stored_counts():
    table, context = FakeTable("stats"), StepContext()
    table[b"p1"] = b'{"received": 10}'
    counters = Counters(table, context, read=lambda partition, key: table.get(key))
    counted(counters, context, 1, "received")
    assert counters.total([1], lambda partition, key: None)["received"] == 11


def spend(tenant: str, window: str = "2026-12") -> str:
    return f"spend|t|{tenant}|{window}"


def test_a_write_carries_the_spend_that_moved_not_every_tenants():
    """5,000 tenants in one blob made every commit of a partition rewrite tens of kilobytes."""
    table, context = FakeTable("stats"), StepContext()
    counters = Counters(table, context, read=lambda partition, key: table.get(key))
    for i in range(300):
        counted(counters, context, 4, spend(f"t{i}"), 10)
    counters.written(4, counters.unwritten(4))
    counted(counters, context, 4, "cost_nusd", 7)
    counted(counters, context, 4, spend("t7"), 7)
    sealed = counters.unwritten(4)
    assert [(key, value) for _, key, value in sealed] == [
        (b"p4|" + spend("t7").encode(), b"17"),
        (b"p4", b'{"cost_nusd":7}'),
    ], "the spend keys first, the blob last (a reader between them keeps the blob's older spend)"
    assert counters.value(4, spend("t7")) == 17 and counters.value(4, spend("t8")) == 10


def test_a_forgotten_spend_counter_is_deleted():
    table, context = FakeTable("stats"), StepContext()
    counters = Counters(
        table, context, read=lambda p, key: table.get(key), forget=lambda name: name.endswith("|2026-10")
    )
    counted(counters, context, 0, spend("a", "2026-10"), 5)
    counters.written(0, counters.unwritten(0))
    counted(counters, context, 0, spend("a", "2026-12"), 2)
    records = {key: value for _, key, value in counters.unwritten(0)}
    assert records[b"p0|" + spend("a", "2026-10").encode()] is None
    assert records[b"p0|" + spend("a", "2026-12").encode()] == b"2"


def test_spend_written_in_the_blob_before_moves_to_keys_of_its_own_at_the_next_write():
    table, context = FakeTable("stats"), StepContext()
    table[b"p2"] = json.dumps({"received": 4, spend("a"): 30, spend("b"): 5}).encode()
    table[b"p2|" + spend("b").encode()] = b"9"  # a key of its own wins over the blob
    counters = Counters(table, context, read=lambda partition, key: table.get(key))
    assert counters.value(2, spend("a")) == 30, "read from the blob until the partition is loaded"
    counted(counters, context, 2, "received")
    records = {key: value for _, key, value in counters.unwritten(2)}
    assert json.loads(records.pop(b"p2")) == {"received": 5}
    assert records == {b"p2|" + spend("a").encode(): b"30", b"p2|" + spend("b").encode(): b"9"}


def test_through_the_at_least_once_writes_a_partition_reloads_the_same_counts():
    table, context = FakeTable("stats"), StepContext()
    counters = Counters(table, context, read=lambda partition, key: table.get(key))
    counted(counters, context, 1, "received", 2)
    counted(counters, context, 1, spend("a"), 3)
    token = context.enter(Step(1))
    counters.flush_due(1, open_steps=1)
    context.leave(token)
    again = Counters(table, context, read=lambda partition, key: table.get(key))
    assert again.value(1, "received") == 2 and again.value(1, spend("a")) == 3
    counted(again, context, 1, spend("a"), 1)
    assert again.spend(1) == {spend("a"): 4}


def test_a_partition_back_unchanged_after_a_rebalance_keeps_its_unwritten_spend():
    table, context = FakeTable("stats"), StepContext()
    counters = Counters(table, context, read=lambda partition, key: table.get(key))
    counted(counters, context, 0, spend("a"), 3)
    sealed = counters.unwritten(0)
    for _, key, value in sealed:
        table[key] = value
    counters.written(0, sealed)
    counted(counters, context, 0, spend("a"), 2)  # counted, not yet written
    counters.on_revoked()
    counted(counters, context, 0, "received")  # back, and nobody wrote it meanwhile
    records = {key: value for _, key, value in counters.unwritten(0)}
    assert records[b"p0|" + spend("a").encode()] == b"5"


def test_a_counter_back_at_zero_leaves_the_blob():
    """`dlq_model|<model>` goes up and down with the DLQ: a model name per request would
    otherwise stay in the blob, and in every commit's write, for good."""
    table, context = FakeTable("stats"), StepContext()
    counters = Counters(table, context, read=lambda partition, key: table.get(key))
    counted(counters, context, 0, "dlq_model|one-off-model")
    counted(counters, context, 0, "dlq_size")
    counted(counters, context, 0, "dlq_model|one-off-model", -1)
    [(_, _, blob)] = counters.unwritten(0)
    assert json.loads(blob) == {"dlq_size": 1}


def test_reading_a_partitions_spend_loads_nothing_a_later_step_would_count_on():
    """GET /budgets/ reads owned partitions' spend, also while their changelog is recovered: a
    partition loaded then made its next step write its counts on a half-recovered base."""
    table, context = FakeTable("stats"), StepContext()
    counters = Counters(table, context, read=lambda partition, key: table.get(key))
    assert counters.spend(0) == {}  # read during recovery: nothing there yet
    table[b"p0"] = json.dumps({"received": 100, "dlq_size": 7}).encode()  # the recovered counts
    table[b"p0|" + spend("a").encode()] = b"40"
    assert counters.spend(0) == {spend("a"): 40}
    counted(counters, context, 0, "received")
    records = {key: value for _, key, value in counters.unwritten(0)}
    assert json.loads(records[b"p0"]) == {"received": 101, "dlq_size": 7}
