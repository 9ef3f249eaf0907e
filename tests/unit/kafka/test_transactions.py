"""Exactly-once outputs (dlqapp.kafka.transactions) over a fake transactional producer:
what commits together, what waits for what, and what a failure does."""

from __future__ import annotations

import asyncio

import pytest

from dlqapp.kafka.step_barrier import StepBarrier
from dlqapp.kafka.transaction_errors import NotOwned, TransactionFailed
from dlqapp.kafka.transactions import PartitionTransaction, Transactions
from tests.unit.fake_kafka import FakeProducer


async def started(producer: FakeProducer) -> PartitionTransaction:
    """Partition 0's transaction over `producer`, started (its first transaction open)."""
    transaction = PartitionTransaction(0, producer, timeout_s=5)
    await transaction.start()
    return transaction


async def step(
    transaction: PartitionTransaction, *records: tuple[str, bytes], hold: asyncio.Event | None = None
) -> None:
    """What a stream step does: enter, send, (maybe wait), leave, then wait for the commit."""
    await transaction.barrier.enter()
    try:
        for topic, value in records:
            await transaction.send(topic, b"k", value, 0, None)
            if hold is not None:
                await hold.wait()
        committed = transaction.committed()
    finally:
        await transaction.barrier.leave()
    await committed


async def sent(transaction: PartitionTransaction, *records: tuple[str, bytes]) -> None:
    """A step's outputs handed to the open transaction, without waiting for its commit."""
    await transaction.barrier.enter()
    try:
        for topic, value in records:
            await transaction.send(topic, b"k", value, 0, None)
    finally:
        await transaction.barrier.leave()


def test_a_step_is_acked_only_after_its_transaction_commits_and_its_outputs_become_visible_together():
    async def run():
        producer = FakeProducer()
        transaction = await started(producer)
        done = asyncio.create_task(step(transaction, ("results", b"r1"), ("requests-changelog", b"state")))
        await asyncio.sleep(0.01)
        assert not done.done() and producer.visible == []  # sent, not committed, not acked
        await transaction.commit()
        await asyncio.wait_for(done, 1)
        assert producer.visible == [("results", b"r1"), ("requests-changelog", b"state")]

    asyncio.run(run())


def test_a_commit_waits_for_the_step_inside_so_a_step_never_straddles_two_transactions():
    async def run():
        producer = FakeProducer()
        transaction = await started(producer)
        hold = asyncio.Event()
        inside = asyncio.create_task(step(transaction, ("results", b"a"), ("changelog", b"a-state"), hold=hold))
        await asyncio.sleep(0.01)
        commit = asyncio.create_task(transaction.commit())
        await asyncio.sleep(0.01)
        late = asyncio.create_task(step(transaction, ("results", b"b")))  # held back while the commit waits
        await asyncio.sleep(0.01)
        assert not commit.done() and producer.visible == []
        hold.set()
        await asyncio.wait_for(commit, 1)
        assert producer.visible == [
            ("results", b"a"),
            ("changelog", b"a-state"),
        ]  # the whole first step, nothing of the second
        await transaction.commit()
        await asyncio.wait_for(asyncio.gather(inside, late), 1)
        assert producer.visible[-1] == ("results", b"b") and producer.commits == 2

    asyncio.run(run())


def test_a_rebalance_closing_a_partition_waits_for_the_periodic_commit_under_way():
    async def run():
        producer = FakeProducer()
        transaction = await started(producer)
        done = asyncio.create_task(step(transaction, ("results", b"r1")))
        await asyncio.sleep(0.01)
        producer.answer.clear()  # a slow broker: the periodic commit waits for EndTxn
        periodic = asyncio.create_task(transaction.commit())
        await asyncio.sleep(0.01)
        closing = asyncio.create_task(transaction.close())
        await asyncio.sleep(0.01)
        assert not producer.stopped and not closing.done()
        producer.answer.set()
        await asyncio.wait_for(asyncio.gather(periodic, closing, done), 1)
        assert producer.visible == [("results", b"r1")] and producer.stopped

    asyncio.run(run())


def test_a_failed_send_fails_the_commit_and_every_step_waiting_on_it():
    async def run():
        producer = FakeProducer(fail_send=True)
        transaction = await started(producer)
        waiting = asyncio.create_task(step(transaction, ("results", b"x")))
        await asyncio.sleep(0.01)
        with pytest.raises(TransactionFailed):
            await transaction.commit()
        with pytest.raises(TransactionFailed):
            await waiting
        assert producer.commits == 0 and producer.visible == []

    asyncio.run(run())


def test_a_spoiled_transaction_never_commits():
    async def run():
        producer = FakeProducer()
        transaction = await started(producer)
        await transaction.barrier.enter()
        await transaction.send("results", b"k", b"half of a step", 0, None)
        transaction.spoil("a step failed after it sent outputs")
        await transaction.barrier.leave()
        with pytest.raises(TransactionFailed, match="a step failed"):
            await transaction.commit()
        assert producer.visible == []

    asyncio.run(run())


def test_a_producer_fenced_between_two_transactions_refuses_every_later_send_as_a_transaction_failure():
    """Not the record's fault: a send after it must stop the worker, never dead-letter the record."""

    async def run():
        producer = FakeProducer()
        transaction = await started(producer)
        await sent(transaction, ("results", b"committed"))
        producer.fail_begin = True
        with pytest.raises(TransactionFailed, match="could not begin"):
            await transaction.commit()
        assert producer.visible == [("results", b"committed")]
        with pytest.raises(TransactionFailed):
            await transaction.send("dlq", b"k", b"too late", 0, None)

    asyncio.run(run())


def test_a_send_the_producer_refuses_spoils_the_transaction():
    async def run():
        producer = FakeProducer()
        transaction = await started(producer)
        await transaction.barrier.enter()
        await transaction.send("results", b"k", b"first half", 0, None)
        producer.open = None  # the producer lost its transaction under us
        with pytest.raises(TransactionFailed, match="a send to dlq failed"):
            await transaction.send("dlq", b"k", b"second half", 0, None)
        await transaction.barrier.leave()
        with pytest.raises(TransactionFailed):
            await transaction.commit()

    asyncio.run(run())


def test_an_idle_transaction_commits_nothing():
    async def run():
        producer = FakeProducer()
        transaction = await started(producer)
        await transaction.commit()
        assert producer.commits == 0

    asyncio.run(run())


def test_partitions_are_fenced_on_assignment_committed_on_revocation_and_refused_after():
    async def run():
        made: dict[str, FakeProducer] = {}

        def new_producer(transactional_id: str) -> FakeProducer:
            made[transactional_id] = FakeProducer(transactional_id)
            return made[transactional_id]

        transactions = Transactions("app", new_producer, timeout_s=5)
        await transactions.assign({0, 3})
        assert sorted(made) == ["app-0", "app-3"] and all(p.started for p in made.values())
        three = transactions.of(3)
        waiting = asyncio.create_task(step(three, ("dlq", b"d")))
        await asyncio.sleep(0.01)
        await transactions.revoke({3})
        await asyncio.wait_for(waiting, 1)
        assert made["app-3"].visible == [("dlq", b"d")] and made["app-3"].stopped
        with pytest.raises(NotOwned):
            transactions.of(3)
        assert transactions.partitions == [0]

    asyncio.run(run())


def test_a_producer_that_cannot_start_names_the_transactional_id():
    class Refused(FakeProducer):
        async def start(self) -> None:
            raise type("TransactionalIdAuthorizationFailed", (Exception,), {})("denied")

    async def run():
        transactions = Transactions("app", lambda tid: Refused(tid), timeout_s=5)
        with pytest.raises(TransactionFailed, match=r"app-2.*transactional ids app- \(prefixed\)"):
            await transactions.assign({2})

    asyncio.run(run())


def test_the_barrier_holds_steps_back_only_while_a_commit_waits_or_runs():
    async def run() -> None:
        barrier = StepBarrier()
        await barrier.enter()
        closing = asyncio.create_task(barrier.close())
        await asyncio.sleep(0)
        entering = asyncio.create_task(barrier.enter())
        await asyncio.sleep(0)
        assert not closing.done() and not entering.done() and barrier.inside == 1
        await barrier.leave()
        await asyncio.wait_for(closing, 1)  # the last step left: the commit may run
        assert not entering.done()  # held back until the next transaction begins
        await barrier.reopen()
        await asyncio.wait_for(entering, 1)
        assert barrier.inside == 1
        closing = asyncio.create_task(barrier.close())
        await asyncio.sleep(0)
        closing.cancel()  # a commit given up while it waited lets steps in again
        await asyncio.gather(closing, return_exceptions=True)
        await asyncio.wait_for(barrier.enter(), 1)
        assert barrier.inside == 2

    asyncio.run(run())
