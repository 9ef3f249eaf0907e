"""Table writes of a stream step: RocksDB at once, changelog records sent and confirmed at its end."""

from __future__ import annotations

import asyncio
import functools
import weakref
from dataclasses import dataclass
from typing import Any

import faust
import pytest
from faust.streams import _current_event

from dlqapp.tables import durability
from dlqapp.tables.durability import ConfirmedTable, changelog_barrier


@dataclass
class _Message:
    partition: int
    topic: str = "input"
    offset: int = 0


@dataclass
class _Event:
    message: _Message


@dataclass
class _Metadata:
    offset: int


class RecordingProducer:
    """Faust's producer `send`: records each record; the broker confirms when told to."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None, int]] = []
        self.pending: list[asyncio.Future[_Metadata]] = []
        self.auto_confirm = True

    async def send(
        self, topic: str, key: bytes, value: bytes | None, partition: int, timestamp: Any, headers: Any
    ) -> asyncio.Future[_Metadata]:
        self.sent.append((topic, key, value, partition))
        future: asyncio.Future[_Metadata] = asyncio.get_running_loop().create_future()
        if self.auto_confirm:
            future.set_result(_Metadata(len(self.sent) - 1))
        else:
            self.pending.append(future)
        return future

    def confirm_all(self) -> None:
        for future in self.pending:
            future.set_result(_Metadata(100))
        self.pending.clear()


@pytest.fixture
def table(tmp_path):
    app = faust.App("durability-test", store="rocksdb://", datadir=str(tmp_path), Table=ConfirmedTable)
    producer = RecordingProducer()
    app._producer = producer  # App.producer is a cached property: this is what it returns
    table = app.Table("t", partitions=2, key_type=bytes, value_type=bytes)
    yield table, producer
    for db in table.data._dbs.values():
        db.close()


def synchronously(test: Any) -> Any:
    """Run an async test body on a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


def in_stream(partition: int) -> Any:
    event = _Event(_Message(partition))
    _current_event.set(weakref.ref(event))
    return event  # keep it alive while the step runs


@synchronously
async def test_a_write_is_read_back_at_once_and_its_changelog_record_waits_for_the_end_of_the_step(table):
    table, producer = table
    event = in_stream(1)
    async with changelog_barrier():
        table[b"k"] = b"v1"
        assert table.get(b"k") == b"v1"
        assert producer.sent == []  # not yet: the step is not over
        table[b"k"] = b"v2"
        table[b"other"] = b"x"
    assert producer.sent == [
        ("durability-test-t-changelog", b"k", b"v2", 1),
        ("durability-test-t-changelog", b"other", b"x", 1),
    ]
    assert table.data._db_for_partition(1).get(b"k") == b"v2"
    assert table.data._db_for_partition(0).get(b"k") is None  # the event's partition only
    del event


@synchronously
async def test_the_step_ends_only_once_the_broker_confirmed_its_records(table):
    table, producer = table
    producer.auto_confirm = False
    event = in_stream(0)

    async def step() -> None:
        async with changelog_barrier():
            table[b"k"] = b"v"

    running = asyncio.ensure_future(step())
    while not producer.sent:  # the step has reached its barrier and sent its record
        await asyncio.sleep(0)
    await asyncio.sleep(0)  # one more turn: an unconfirmed record must keep it waiting
    assert not running.done() and len(producer.sent) == 1
    producer.confirm_all()
    await asyncio.wait_for(running, 1)
    del event


@synchronously
async def test_a_hook_after_the_step_runs_once_its_records_are_sent_failed_or_not(table):
    table, producer = table
    event = in_stream(0)
    seen: list[list[tuple]] = []

    async def step(fail: bool) -> None:
        before = len(seen)
        async with changelog_barrier():
            table[b"k"] = b"v"
            durability.after_step_sent(lambda: seen.append(list(producer.sent)))
            assert len(seen) == before  # not while the step runs: its record is not sent yet
            if fail:
                raise RuntimeError("handler failed")

    await step(fail=False)
    assert seen == [[("durability-test-t-changelog", b"k", b"v", 0)]]
    with pytest.raises(RuntimeError):
        await step(fail=True)
    assert len(seen) == 2 and len(seen[1]) == 2
    durability.after_step_sent(lambda: seen.append([]))  # outside a step: at once
    assert seen[-1] == []
    del event


@synchronously
async def test_a_step_waiting_for_the_broker_no_longer_counts_as_open_so_the_last_one_writes(table, monkeypatch):
    table, producer = table
    producer.auto_confirm = False
    event = in_stream(0)
    seen: list[int] = []
    monkeypatch.setattr(durability, "_end_of_step", [lambda: seen.append(durability.open_steps(0))])
    b_may_end = asyncio.Event()

    async def step(name: bytes, hold: asyncio.Event | None = None) -> None:
        async with changelog_barrier():
            table[name] = b"v"
            if hold is not None:
                await hold.wait()

    b = asyncio.ensure_future(step(b"b", b_may_end))
    await asyncio.sleep(0)  # b is inside its step
    a = asyncio.ensure_future(step(b"a"))
    while not producer.sent:  # a has ended its work and waits for the broker
        await asyncio.sleep(0)
    b_may_end.set()
    while len(seen) < 2:
        await asyncio.sleep(0)
    assert seen == [2, 1]  # b, the last of the burst, sees itself alone
    producer.confirm_all()
    while producer.pending or not (a.done() and b.done()):
        producer.confirm_all()
        await asyncio.sleep(0)
    assert durability.open_steps(0) == 0
    del event


@synchronously
async def test_a_delete_sends_a_tombstone(table):
    table, producer = table
    event = in_stream(0)
    async with changelog_barrier():
        table[b"k"] = b"v"
    async with changelog_barrier():
        del table[b"k"]
        assert table.get(b"k") is None
    assert producer.sent[-1] == ("durability-test-t-changelog", b"k", None, 0)
    del event


@synchronously
async def test_a_failed_step_still_sends_what_it_wrote_and_the_failure_propagates(table):
    table, producer = table
    event = in_stream(0)
    with pytest.raises(RuntimeError):
        async with changelog_barrier():
            table[b"k"] = b"v"
            raise RuntimeError("handler failed")
    assert producer.sent == [("durability-test-t-changelog", b"k", b"v", 0)]  # the store and the changelog agree
    del event


@synchronously
async def test_the_changelog_offset_is_noted_after_the_broker_confirmed_and_at_most_every_interval(table, monkeypatch):
    table, _ = table
    now = [1000.0]
    monkeypatch.setattr(durability, "monotonic", lambda: now[0])
    event = in_stream(0)
    tp = faust.types.TP("durability-test-t-changelog", 0)
    async with changelog_barrier():
        table[b"a"] = b"1"
    assert table.data.persisted_offset(tp) == 0
    async with changelog_barrier():
        table[b"b"] = b"2"
    assert table.data.persisted_offset(tp) == 0  # within the interval: an older offset is safe
    now[0] += durability.PERSIST_INTERVAL_S
    async with changelog_barrier():
        table[b"c"] = b"3"
    assert table.data.persisted_offset(tp) == 2
    del event
