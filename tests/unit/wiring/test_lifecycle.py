"""The worker's lifecycle around a rebalance (dlqapp.wiring.agents.WorkerLifecycle): what a
revocation hands back, and that the counts of the last steps reach the partition's last
transaction (sealed after the release, before the counts are set aside)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from dlqapp.tables.counters import Counters
from dlqapp.tables.step import StepContext
from dlqapp.wiring.agents import WorkerLifecycle
from tests.unit.fakes import FakeTable
from tests.unit.tables.test_counters import counted


class Windows:
    async def release(self) -> int:
        return 0


def lifecycle(counters: Counters) -> tuple[WorkerLifecycle, Any]:
    closed: list[bool] = []
    components = SimpleNamespace(
        windows=Windows(),
        steps=SimpleNamespace(exactly_once=True),
        offsets=SimpleNamespace(reset=lambda: None),
        counters=counters,
        crash_guard=SimpleNamespace(close=lambda: closed.append(True)),
        recorder=SimpleNamespace(log=SimpleNamespace(flush=lambda: closed.append("dead-letter log"))),
        tail_read=None,
    )
    return WorkerLifecycle(components), closed  # type: ignore[arg-type]


def test_a_rebalance_leaves_the_last_steps_counts_for_the_partitions_last_seal():
    table, context = FakeTable("stats"), StepContext()
    counters = Counters(table, context, read=lambda partition, key: table.get(key))
    counted(counters, context, 1, "succeeded", 3)
    worker, closed = lifecycle(counters)
    asyncio.run(worker.release(reopen=True))
    sealed = counters.unwritten(1)  # what closing the partition's transaction seals it with
    assert [(key, json.loads(blob)) for _, key, blob in sealed] == [(b"p1", {"succeeded": 3})]
    counters.written(1, sealed)
    worker.revoked()
    assert counters.unwritten(1) == [] and closed == []


def test_a_stop_closes_the_crash_journal_flushes_the_dead_letter_log_and_keeps_the_counts_for_the_last_seal():
    table, context = FakeTable("stats"), StepContext()
    counters = Counters(table, context, read=lambda partition, key: table.get(key))
    counted(counters, context, 0, "received")
    worker, closed = lifecycle(counters)
    asyncio.run(worker.release(reopen=False))
    assert closed == [True, "dead-letter log"] and counters.unwritten(0) != []
