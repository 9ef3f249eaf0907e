"""Stream steps (dlqapp.tables.steps) over a real RocksDB table and a fake producer: table
writes at once, their changelog records at the end of the step; under exactly_once the
step's counts and the partition's progress sealed into the same transaction."""

from __future__ import annotations

import asyncio
import functools
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import faust
import pytest

from dlqapp.kafka.acks import Acks
from dlqapp.kafka.transaction_errors import TransactionFailed
from dlqapp.kafka.transactions import Transactions
from dlqapp.tables import durability
from dlqapp.tables.counters import Counters
from dlqapp.tables.durability import ConfirmedTable
from dlqapp.tables.progress import Progress
from dlqapp.tables.step import OutsideStep, StepContext
from dlqapp.tables.steps import StreamSteps
from tests.unit.fake_kafka import FakeProducer


@dataclass
class _Metadata:
    offset: int


class RecordingProducer:
    """A plain producer's `send`: records each record; the broker confirms when told to."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes | None, int]] = []
        self.pending: list[asyncio.Future[_Metadata]] = []
        self.auto_confirm = True

    async def send(
        self, topic: str, key: bytes, value: bytes | None, partition: int, headers: Any
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


@dataclass
class World:
    context: StepContext
    table: ConfirmedTable
    stats: ConfirmedTable
    progress_table: ConfirmedTable
    producer: RecordingProducer
    counters: Counters


@pytest.fixture
def world(tmp_path):
    app = faust.App("steps-test", store="rocksdb://", datadir=str(tmp_path), Table=ConfirmedTable)
    context = StepContext()
    tables = [
        app.Table(name, partitions=2, key_type=bytes, value_type=bytes, steps=context)
        for name in ("t", "stats", "progress")
    ]
    counters = Counters(tables[1], context)
    yield World(context, *tables, RecordingProducer(), counters)
    for table in tables:
        for db in table.data._dbs.values():
            db.close()


def steps_of(world: World, transactions: Transactions | None = None, progress: Progress | None = None) -> StreamSteps:
    return StreamSteps(
        world.context,
        transactions=transactions,
        send=world.producer.send,
        counters=world.counters,
        seal_tables=progress.seal if progress is not None else lambda partition: [],
        strikes=progress.strike_records if progress is not None else lambda partition, culprits: [],
    )


def synchronously(test: Any) -> Any:
    """Run an async test body on a fresh event loop (the suite has no asyncio plugin)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


# -- at_least_once ------------------------------------------------------------------------


@synchronously
async def test_a_write_is_read_back_at_once_and_its_changelog_record_waits_for_the_end_of_the_step(world):
    steps = steps_of(world)
    async with steps.step(1):
        world.table[b"k"] = b"v1"
        assert world.table.get(b"k") == b"v1"
        assert world.producer.sent == []  # not yet: the step is not over
        world.table[b"k"] = b"v2"
        world.table[b"other"] = b"x"
    assert world.producer.sent == [
        ("steps-test-t-changelog", b"k", b"v2", 1),
        ("steps-test-t-changelog", b"other", b"x", 1),
    ]
    assert world.table.data._db_for_partition(1).get(b"k") == b"v2"
    assert world.table.data._db_for_partition(0).get(b"k") is None  # the step's partition only


@synchronously
async def test_a_write_outside_a_step_is_an_error_not_a_quieter_path(world):
    with pytest.raises(OutsideStep, match="a write to table t outside a stream step"):
        world.table[b"k"] = b"v"
    with pytest.raises(OutsideStep):
        del world.table[b"k"]
    with pytest.raises(OutsideStep):
        world.counters.add("received")
    with pytest.raises(OutsideStep):
        await steps_of(world).send("results", b"k", b"v", 0, None)
    async with steps_of(world).step(0):
        with pytest.raises(TypeError, match="holds bytes"):
            world.table["text"] = b"v"


@synchronously
async def test_the_step_ends_only_once_the_broker_confirmed_its_records(world):
    steps = steps_of(world)
    world.producer.auto_confirm = False

    async def step() -> None:
        async with steps.step(0):
            world.table[b"k"] = b"v"

    running = asyncio.ensure_future(step())
    while not world.producer.sent:  # the step has ended its work and sent its record
        await asyncio.sleep(0)
    await asyncio.sleep(0)  # one more turn: an unconfirmed record must keep it waiting
    assert not running.done() and len(world.producer.sent) == 1
    world.producer.confirm_all()
    await asyncio.wait_for(running, 1)


@synchronously
async def test_a_hook_after_the_step_runs_once_its_records_are_sent_failed_or_not(world):
    steps = steps_of(world)
    seen: list[list[tuple]] = []

    async def step(fail: bool) -> None:
        before = len(seen)
        async with steps.step(0):
            world.table[b"k"] = b"v"
            steps.after_sent(lambda: seen.append(list(world.producer.sent)))
            assert len(seen) == before  # not while the step runs: its record is not sent yet
            if fail:
                raise RuntimeError("handler failed")

    await step(fail=False)
    assert seen == [[("steps-test-t-changelog", b"k", b"v", 0)]]
    with pytest.raises(RuntimeError):
        await step(fail=True)
    assert len(seen) == 2 and len(seen[1]) == 2
    steps.after_sent(lambda: seen.append([]))  # outside a step: at once
    assert seen[-1] == []


@synchronously
async def test_the_last_step_of_a_burst_writes_the_counts_and_an_earlier_one_leaves_them_to_it(world):
    steps = steps_of(world)
    b_may_end = asyncio.Event()

    async def step(hold: asyncio.Event | None = None) -> None:
        async with steps.step(0):
            world.counters.add("received")
            if hold is not None:
                await hold.wait()

    b = asyncio.ensure_future(step(b_may_end))
    await asyncio.sleep(0)  # b is inside its step
    await step()  # a ends while b runs: the counts were written lately? no: first write
    first = [r for r in world.producer.sent if r[0] == "steps-test-stats-changelog"]
    await step()  # within the interval while b still runs: b will write them
    assert [r for r in world.producer.sent if r[0] == "steps-test-stats-changelog"] == first
    b_may_end.set()
    await b
    last = [r for r in world.producer.sent if r[0] == "steps-test-stats-changelog"][-1]
    assert json.loads(last[2]) == {"received": 3} and steps.open_count(0) == 0


@synchronously
async def test_a_delete_sends_a_tombstone_and_a_failed_step_still_sends_what_it_wrote(world):
    steps = steps_of(world)
    async with steps.step(0):
        world.table[b"k"] = b"v"
    async with steps.step(0):
        del world.table[b"k"]
        assert world.table.get(b"k") is None
    assert world.producer.sent[-1] == ("steps-test-t-changelog", b"k", None, 0)
    with pytest.raises(RuntimeError):
        async with steps.step(0):
            world.table[b"k2"] = b"v"
            raise RuntimeError("handler failed")
    assert world.producer.sent[-1] == ("steps-test-t-changelog", b"k2", b"v", 0)  # store and changelog agree


@synchronously
async def test_the_changelog_offset_is_noted_after_the_broker_confirmed_and_at_most_every_interval(world, monkeypatch):
    steps = steps_of(world)
    now = [1000.0]
    monkeypatch.setattr(durability, "monotonic", lambda: now[0])
    tp = faust.types.TP("steps-test-t-changelog", 0)
    async with steps.step(0):
        world.table[b"a"] = b"1"
    assert world.table.data.persisted_offset(tp) == 0
    async with steps.step(0):
        world.table[b"b"] = b"2"
    assert world.table.data.persisted_offset(tp) == 0  # within the interval: an older offset is safe
    now[0] += durability.PERSIST_INTERVAL_S
    async with steps.step(0):
        world.table[b"c"] = b"3"
    assert world.table.data.persisted_offset(tp) == 2


# -- exactly_once -------------------------------------------------------------------------


@dataclass
class _Message:
    topic: str
    partition: int
    offset: int


@dataclass
class _Event:
    message: _Message
    acked: list[int]

    def ack(self) -> bool:
        self.acked.append(self.message.offset)
        return True


async def exactly_once(world: World) -> tuple[StreamSteps, FakeProducer, Acks, Progress]:
    producer = FakeProducer()
    transactions = Transactions("app", lambda transactional_id: producer, timeout_s=5)
    await transactions.assign({0})
    acks = Acks(lambda event: None)
    progress = Progress(
        world.progress_table,
        positions=acks.progress,
        read=lambda partition, key: world.progress_table.data._db_for_partition(partition).get(key),
        has_strikes=lambda partition: False,
    )
    return steps_of(world, transactions, progress), producer, acks, progress


@synchronously
async def test_a_steps_outputs_state_counts_and_progress_commit_together_and_its_event_is_acked_after(world):
    steps, producer, acks, _ = await exactly_once(world)
    acked: list[int] = []
    ticket = acks.track(_Event(_Message("input", 0, 7), acked))
    async with steps.step(0, ticket.position) as step:
        await steps.send("results", b"r1", b"result", 0, None)
        world.table[b"r1"] = b"succeeded"
        world.counters.add("succeeded")
    acks.ended(ticket, step.committed)
    assert producer.visible_keyed == [] and acked == []  # in the transaction, not yet committed
    await steps.commit_all()
    committed = {(topic, key): value for topic, key, value in producer.visible_keyed}
    assert committed[("results", b"r1")] == b"result"
    assert committed[("steps-test-t-changelog", b"r1")] == b"succeeded"
    assert json.loads(committed[("steps-test-stats-changelog", b"p0")]) == {"succeeded": 1}
    assert json.loads(committed[("steps-test-progress-changelog", b"input")]) == {"next": 8, "also": []}  # 7 done
    await asyncio.sleep(0)
    assert acked == [7]


@synchronously
async def test_counts_join_only_inside_the_transaction_so_a_commit_between_never_splits_them_from_their_state(world):
    """A step ends while a commit is closing its transaction: its counts must wait with its
    records for the next transaction, never be sealed into this one without its state."""
    steps, producer, _, _ = await exactly_once(world)
    transaction = steps.transactions.of(0)
    await transaction.barrier.enter()  # another step holds the transaction open
    await transaction.send("results", b"other", b"x", 0, None)
    may_end = asyncio.Event()
    writer = asyncio.ensure_future(_count_and_write(steps, world, may_end))
    commit = asyncio.ensure_future(steps.commit_all())
    while not transaction.barrier._committing:  # the commit closes the gate, waiting for the other step
        await asyncio.sleep(0)
    may_end.set()  # the writer ends its step now, and waits at the closed gate
    for _ in range(5):
        await asyncio.sleep(0)
    await transaction.barrier.leave()
    await commit
    first = {(topic, key): value for topic, key, value in producer.visible_keyed}
    assert ("steps-test-t-changelog", b"r2") not in first
    assert ("steps-test-stats-changelog", b"p0") not in first  # not without its state
    await writer
    await steps.commit_all()
    both = {(topic, key): value for topic, key, value in producer.visible_keyed}
    assert json.loads(both[("steps-test-stats-changelog", b"p0")]) == {"received": 1}
    assert both[("steps-test-t-changelog", b"r2")] == b"in"


async def _count_and_write(steps: StreamSteps, world: World, may_end: asyncio.Event) -> None:
    async with steps.step(0):
        world.table[b"r2"] = b"in"
        world.counters.add("received")
        await may_end.wait()


@synchronously
async def test_a_step_cancelled_while_it_hands_its_records_over_hands_them_all_over(world):
    """The result must never commit without the state written beside it."""
    steps, producer, _, _ = await exactly_once(world)
    transaction = steps.transactions.of(0)
    entered = asyncio.Event()

    async def step() -> None:
        async with steps.step(0):
            await steps.send("results", b"r3", b"result", 0, None)
            world.table[b"r3"] = b"succeeded"
            world.table[b"r3-more"] = b"x"
            entered.set()

    original = transaction.send
    sends = 0

    async def slow_send(*args: Any, **kwargs: Any) -> Any:
        nonlocal sends
        sends += 1
        if sends == 2:  # the first changelog record: give the canceller a turn
            await asyncio.sleep(0)
        return await original(*args, **kwargs)

    transaction.send = slow_send  # type: ignore[method-assign]
    task = asyncio.ensure_future(step())
    await entered.wait()
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.01)  # the shielded hand-over finishes
    await steps.commit_all()
    keys = {key for _, key, _ in producer.visible_keyed}
    assert {b"r3", b"r3-more"} <= keys


@synchronously
async def test_cancelling_one_waiter_of_a_commit_does_not_cancel_it_for_the_others(world):
    steps, _, acks, _ = await exactly_once(world)
    acked: list[int] = []
    tickets = [acks.track(_Event(_Message("input", 0, offset), acked)) for offset in (1, 2)]
    for ticket in tickets:
        async with steps.step(0, ticket.position) as step:
            await steps.send("results", str(ticket.offset).encode(), b"v", 0, None)
        acks.ended(ticket, step.committed)
    waiter = asyncio.ensure_future(asyncio.shield(step.committed))
    await asyncio.sleep(0)
    waiter.cancel()
    await steps.commit_all()
    await asyncio.sleep(0)
    assert acked == [1, 2] and not step.committed.cancelled()


@synchronously
async def test_a_step_that_fails_after_its_first_output_spoils_the_transaction_and_names_its_record(world):
    steps, producer, acks, progress = await exactly_once(world)
    ticket = acks.track(_Event(_Message("input", 0, 41), []))
    with pytest.raises(RuntimeError):
        async with steps.step(0, ticket.position):
            await steps.send("results", b"r4", b"half", 0, None)
            raise RuntimeError("a bug after the first output")
    with pytest.raises(TransactionFailed) as failure:
        await steps.commit_all()
    assert failure.value.culprits == (("input", 0, 41),)
    assert producer.visible_keyed == [("steps-test-progress-changelog", b"strike:input:41", b"1")]
    assert progress.strikes("input", 0, 41) == 0  # has_strikes says none in this fake: see the window tests


@synchronously
async def test_a_record_the_broker_refuses_is_named_and_struck_once_more_each_time(world):
    from aiokafka.errors import RecordTooLargeError

    steps, producer, acks, _ = await exactly_once(world)
    producer.refuse["results"] = RecordTooLargeError()
    for attempt in (1, 2):
        if attempt == 2:
            await steps.transactions.assign({0})  # the restart: a new owner of partition 0
        ticket = acks.track(_Event(_Message("input", 0, 9), []))
        async with steps.step(0, ticket.position):
            await steps.send("results", b"r5", b"too big for the broker", 0, None)
        with pytest.raises(TransactionFailed) as failure:
            await steps.commit_all()
        assert failure.value.culprits == (("input", 0, 9),)
        assert producer.visible_keyed[-1] == ("steps-test-progress-changelog", b"strike:input:9", str(attempt).encode())
        steps.transactions._open.clear()


def test_counts_of_a_step_are_kept_in_the_step_until_it_ends(tmp_path):
    context = StepContext()
    counters = Counters({}, context, read=lambda partition, key: None)
    from dlqapp.tables.step import Step

    step = Step(0)
    token = context.enter(step)
    counters.add("received")
    context.leave(token)
    assert step.counts == Counter({"received": 1}) and counters.total([0], lambda p, k: None) == Counter()


@synchronously
async def test_an_event_ends_inside_its_transaction_so_the_commit_that_holds_its_outputs_holds_its_progress(world):
    """Issue 39 in CI: a commit between a step's hand-over and its event's end sealed the step's
    outputs without its progress; after a kill -9 the event ran again and dead-lettered its
    request a second time."""
    from dlqapp.processing.flow import InFlightWindow

    steps, producer, acks, _ = await exactly_once(world)
    transaction = steps.transactions.of(0)
    leave = transaction.barrier.leave

    async def leave_then_commit() -> None:  # the periodic commit comes the moment the step leaves
        await leave()
        await steps.commit_all()

    transaction.barrier.leave = leave_then_commit  # type: ignore[method-assign]

    async def poison(ticket: Any, exc: BaseException) -> None:
        raise exc

    window = InFlightWindow(4, steps=steps, acks=acks, on_poison=poison, on_stop=lambda exc: None)
    ticket = acks.track(_Event(_Message("input", 0, 7), []))

    async def handler() -> None:
        await steps.send("dlq", b"r9", b"dead letter", 0, None)

    await window.submit(ticket, handler)
    await window.join()
    committed = {(topic, key): value for topic, key, value in producer.visible_keyed}
    assert ("dlq", b"r9") in committed
    assert json.loads(committed[("steps-test-progress-changelog", b"input")])["next"] == 8
