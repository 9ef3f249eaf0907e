"""The tail read (dlqapp.kafka.tail_read): when it starts and stops, and what it hands over."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition

from dlqapp.kafka.tail_read import TURN_S, TailRead, tail_reads


def test_a_partition_is_read_at_its_end_once_the_door_is_lag_behind_and_until_the_door_gets_there():
    ends = {0: 5_000, 1: 1_500, 2: 9_000}.get
    door = {0: 1_000, 1: 1_000, 2: None}.get  # nothing came through partition 2's door yet
    start, stop = tail_reads([0, 1, 2], ends=ends, expected=door, reading={}, lag=2_000)
    assert start == {0: 5_000} and stop == set()
    start, stop = tail_reads([0], ends=ends, expected={0: 5_100}.get, reading={0: 5_200}, lag=2_000)
    assert start == {} and stop == set()  # still behind the tail read
    start, stop = tail_reads([0], ends=ends, expected={0: 5_200}.get, reading={0: 5_200}, lag=2_000)
    assert stop == {0}
    start, stop = tail_reads([3], ends={3: None}.get, expected={3: 0}.get, reading={}, lag=1)
    assert start == {} and stop == set()  # its end is not known


class FakeConsumer:
    """What the tail read uses of aiokafka's consumer, over an in-memory log per partition."""

    def __init__(self, logs: dict[int, list[str]], per_call: int = 2) -> None:
        self.logs = logs
        self.per_call = per_call
        self.assigned: list[TopicPartition] = []
        self.positions: dict[TopicPartition, int] = {}
        self.started = self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = list(partitions)
        self.positions = {tp: 0 for tp in partitions}

    def seek(self, partition: TopicPartition, offset: int) -> None:
        assert partition in self.assigned
        self.positions[partition] = offset

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None) -> Any:
        out = {}
        for tp in self.assigned:
            at = self.positions[tp]
            records = self.logs[tp.partition][at : at + self.per_call]
            if records:
                out[tp] = [
                    SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=at + i, value=v)
                    for i, v in enumerate(records)
                ]
                self.positions[tp] = at + len(records)
        await asyncio.sleep(0)
        return out


def test_the_tail_read_hands_over_each_record_past_the_end_once_and_stops_when_the_door_catches_up():
    async def run() -> None:
        logs = {0: [f"a{i}" for i in range(10)], 1: [f"b{i}" for i in range(10)]}
        consumer = FakeConsumer(logs)
        door = {0: 2, 1: 9}
        ends = {0: 6, 1: 10}
        tail = TailRead(
            lambda: consumer, topic="in", lag=3, partitions=lambda: [0, 1], ends=ends.get, expected=door.get
        )
        got: list[str] = []

        async def claim(record: Any) -> None:
            got.append(record.value)

        await tail.step(claim)  # not assigned yet: nothing
        assert got == [] and not consumer.started
        tail.assigned()
        await tail.step(claim)  # partition 0 is 4 behind its end: read from offset 6 on
        assert consumer.started and tail.reading == {0: 8} and got == ["a6", "a7"]
        door[0] = 7  # the door is catching up, not there yet
        await tail.step(claim)
        assert got == ["a6", "a7", "a8", "a9"] and tail.reading == {0: 10}
        door[0] = 10
        await tail.step(claim)  # the door got there: partition 0's tail read stops
        assert tail.reading == {} and got == ["a6", "a7", "a8", "a9"]
        tail.revoked()
        ends[1], door[1] = 10, 1
        await tail.step(claim)  # revoked: nothing is read, however far behind
        assert tail.reading == {} and tail.claimed == 4

    asyncio.run(run())


def test_a_large_batch_lets_other_tasks_run_every_few_milliseconds():
    """A batch of a flood read at the tail must not hold the event loop (a due retry waits on it)."""

    async def run() -> None:
        consumer = FakeConsumer({0: [f"a{i}" for i in range(200)]}, per_call=100)
        tail = TailRead(
            lambda: consumer, topic="in", lag=1, partitions=lambda: [0], ends={0: 100}.get, expected={0: 0}.get
        )
        turns = 0
        seen_at: list[int] = []

        async def ticker() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        async def claim(record: Any) -> None:
            seen_at.append(turns)  # never suspends, like a record left to the door
            time.sleep(0.001)  # the work of looking at a record, holding the loop

        ticking = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        tail.assigned()
        await tail.step(claim)
        ticking.cancel()
        assert len(seen_at) == 100
        longest = max(seen_at.count(turn) for turn in set(seen_at))
        assert longest <= TURN_S / 0.001 + 1  # the other task ran at least every TURN_S

    asyncio.run(run())


def test_a_new_assignment_drops_a_batch_read_for_the_old_one():
    async def run() -> None:
        consumer = FakeConsumer({0: [f"a{i}" for i in range(10)]})
        tail = TailRead(
            lambda: consumer, topic="in", lag=1, partitions=lambda: [0], ends={0: 5}.get, expected={0: 0}.get
        )
        got: list[str] = []

        async def claim(record: Any) -> None:
            got.append(record.value)
            tail.assigned()  # a rebalance while the batch is handed over

        tail.assigned()
        await tail.step(claim)
        assert got == ["a5"]  # the rest of the batch belonged to the old assignment

    asyncio.run(run())


def test_a_lag_of_zero_never_reads():
    async def run() -> None:
        made: list[FakeConsumer] = []
        tail = TailRead(
            lambda: made.append(FakeConsumer({})) or made[-1],  # type: ignore[func-returns-value]
            topic="in",
            lag=0,
            partitions=lambda: [0],
            ends={0: 10_000}.get,
            expected={0: 0}.get,
        )
        tail.assigned()
        await tail.run(lambda record: asyncio.sleep(0))
        assert made == []

    asyncio.run(run())


def test_a_failing_tail_read_starts_over_later_and_never_stops_the_worker(monkeypatch):
    import dlqapp.kafka.tail_read as module

    async def run() -> None:
        made: list[FakeConsumer] = []

        class Broken(FakeConsumer):
            async def getmany(self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None):
                raise RuntimeError("the broker went away")

        def new() -> FakeConsumer:
            made.append((Broken if not made else FakeConsumer)({0: [f"a{i}" for i in range(10)]}))
            return made[-1]

        got: list[str] = []

        async def claim(record: Any) -> None:
            got.append(record.value)

        monkeypatch.setattr(module, "RETRY_S", 0.01)
        tail = TailRead(new, topic="in", lag=1, partitions=lambda: [0], ends={0: 8}.get, expected={0: 0}.get)
        tail.assigned()
        task = asyncio.create_task(tail.run(claim))
        while len(got) < 2:
            await asyncio.sleep(0.005)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert made[0].stopped and made[1].stopped and got == ["a8", "a9"]

    asyncio.run(run())
