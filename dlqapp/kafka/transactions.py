"""Exactly-once outputs: one Kafka transaction per owned partition number per interval.

dlqapp co-partitions every topic and table (a request's messages, state, parked retries
and dead letter all sit on the partition its id hashes to), so the outputs of one
partition's stream steps can be committed together: results, dead letters, tier and
forwarded messages, and the records of its table changelogs. Each owned partition number
`p` has its own transactional producer, `transactional.id = <app id>-<p>`; a new owner's
`start()` (InitProducerId) fences the previous owner's producer, so a frozen worker that
wakes up (a zombie) can no longer commit anything.

A step enters its partition's transaction at its first output and leaves it when its
outputs are sent (`StepBarrier`: steps share the transaction, a commit waits for the steps
inside and holds new ones back, so a step never straddles two transactions); it is acked
only after that transaction has committed (`committed()`). Offsets stay Faust's: an input
is acked, and its offset committed, only after its outputs are; a redelivered input whose
outputs committed is recognised by the request state committed with them.

A failed send or commit is fatal for the worker (`TransactionFailed`): the transaction is
aborted by the broker (or by the next owner's fencing), and the local tables, which hold
writes of it, are rebuilt from the changelogs at the next start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from aiokafka.errors import MessageSizeTooLargeError

from dlqapp.kafka.step_barrier import StepBarrier
from dlqapp.kafka.transaction_errors import RECORD_ERRORS, NotOwned, Position, RecordTooLarge, TransactionFailed

log = logging.getLogger("dlqapp.kafka.transactions")


START_TIMEOUT_S = 60.0
"""Longest a new owner waits for its producer's InitProducerId (a refused grant fails at once)."""


class TransactionalProducer(Protocol):
    """What dlqapp uses of aiokafka's transactional `AIOKafkaProducer`."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def begin_transaction(self) -> None: ...

    async def commit_transaction(self) -> None: ...

    async def abort_transaction(self) -> None: ...

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Any = None,
    ) -> asyncio.Future[Any]: ...


Seal = Callable[["PartitionTransaction"], Awaitable[None]]
"""Sends a transaction's last records once no step is inside it (the partition's counts and
progress, dlqapp.tables.steps), just before it commits."""


class PartitionTransaction:
    """The transactional producer of one owned partition number, and its open transaction."""

    def __init__(self, partition: int, producer: TransactionalProducer, timeout_s: float) -> None:
        self.partition = partition
        self.producer = producer
        self.timeout_s = timeout_s
        self.barrier = StepBarrier()
        self._sends: list[tuple[Awaitable[Any], Position | None]] = []
        self._commit: asyncio.Future[None] | None = None
        self._closed = False
        self._failure: TransactionFailed | None = None
        """Why the transaction closed, when it failed (else it was handed back)."""
        self._spoiled: str | None = None
        self._culprits: list[Position] = []
        self._committing = asyncio.Lock()
        """One commit at a time: the periodic one, a rebalance's and a shutdown's may meet."""
        self.commits = 0

    async def start(self) -> None:
        """Fence every earlier producer of this partition number and open a transaction.

        Bounded by START_TIMEOUT_S, not the transaction timeout: the transaction coordinator
        may be on a broker that just died and is not yet fenced by the controller."""
        await asyncio.wait_for(self.producer.start(), max(self.timeout_s, START_TIMEOUT_S))
        await self._begin()

    async def _begin(self) -> None:
        await self.producer.begin_transaction()
        self._commit = asyncio.get_running_loop().create_future()

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        headers: Any,
        culprit: Position | None = None,
    ) -> Awaitable[Any]:
        """Hand one record to the open transaction (the caller is inside the gate, or seals it);
        `culprit` is the consumed record whose step sends it.

        Raises `NotOwned` once the partition was handed back, `RecordTooLarge` when the
        producer refuses the record for its size (the transaction is untouched), and
        `TransactionFailed` for any other refusal (the transaction is spoiled)."""
        if self._closed:
            raise self._failure or NotOwned(f"partition {self.partition} was handed back; its transaction is closed")
        try:
            pending = await self.producer.send(topic, value, key=key, partition=partition, headers=headers)
        except MessageSizeTooLargeError as exc:  # checked before the record joins a batch
            raise RecordTooLarge(f"a record for {topic} is too large for the producer: {exc}") from exc
        except Exception as exc:  # e.g. fenced between two transactions: not the record's fault
            self.spoil(f"a send to {topic} failed")
            raise TransactionFailed(
                f"partition {self.partition}: a send to {topic} failed: {type(exc).__name__}: {exc}"
            ) from exc
        self._sends.append((pending, culprit))
        return pending

    def committed(self) -> asyncio.Future[None]:
        """Resolves when the open transaction has committed (fails with `TransactionFailed`).

        Shared by every step of the transaction: await it through `asyncio.shield`, or a
        cancelled waiter cancels it for all."""
        if self._commit is None:
            raise NotOwned(f"partition {self.partition} has no open transaction")
        return self._commit

    @property
    def has_outputs(self) -> bool:
        return bool(self._sends) or self._spoiled is not None

    def spoil(self, reason: str, culprit: Position | None = None) -> None:
        """The open transaction holds part of a step's outputs: it must never commit."""
        self._spoiled = self._spoiled or reason
        if culprit is not None:
            self._culprits.append(culprit)

    async def commit(self, seal: Seal | None = None) -> None:
        """Commit the open transaction (when it holds anything) and begin the next one."""
        async with self._committing:
            await self._commit_unlocked(seal)

    async def _commit_unlocked(self, seal: Seal | None) -> None:
        if self._closed or not (self._sends or self.barrier.inside):
            return
        await self.barrier.close()
        try:
            if seal is not None and self._spoiled is None and self._sends:
                await seal(self)
            await self._commit_open()
        finally:
            await self.barrier.reopen()

    async def _commit_open(self) -> None:
        done, sends = self._commit, self._sends
        self._sends = []
        try:
            if self._spoiled is not None:
                raise TransactionFailed(
                    f"partition {self.partition}: {self._spoiled}; its transaction is not committed",
                    tuple(self._culprits),
                )
            # aiokafka commits even when a send of the transaction failed: check each first
            await asyncio.wait_for(self._delivered(pending for pending, _ in sends), self.timeout_s)
            await asyncio.wait_for(self.producer.commit_transaction(), self.timeout_s)
        except BaseException as exc:
            failure = (
                exc
                if isinstance(exc, TransactionFailed)
                else TransactionFailed(
                    f"partition {self.partition}: transaction not committed: {type(exc).__name__}: {exc}",
                    _refused(sends),
                )
            )
            self._fail(failure)
            if done is not None and not done.done():
                done.set_exception(failure)
                done.exception()  # retrieved: the steps waiting on it see it, nobody else must
            raise failure from exc
        self.commits += 1
        if done is not None and not done.done():
            done.set_result(None)
        try:
            await self._begin()
        except Exception as exc:  # fenced between two transactions: nothing more may be sent
            failure = TransactionFailed(
                f"partition {self.partition}: the next transaction could not begin: {type(exc).__name__}: {exc}"
            )
            self._fail(failure)
            raise failure from exc

    async def strike(self, records: list[tuple[str, bytes, bytes]]) -> None:
        """After a failure that named culprits: abort what is left of the transaction, and
        commit `records` (topic, key, value: the culprits' strikes) in a transaction of their
        own, so that whoever owns the partition next knows them. Raises when it cannot."""
        await asyncio.wait_for(self.producer.abort_transaction(), self.timeout_s)
        await self.producer.begin_transaction()
        pending = [
            await self.producer.send(topic, value, key=key, partition=self.partition) for topic, key, value in records
        ]
        await asyncio.wait_for(self._delivered(pending), self.timeout_s)
        await asyncio.wait_for(self.producer.commit_transaction(), self.timeout_s)

    async def _delivered(self, sends: Iterable[Awaitable[Any]]) -> None:
        """Send the records the producer holds back (its linger lasts a commit interval: no
        read_committed consumer reads them before the commit), then wait for each."""
        accumulator = getattr(self.producer, "_message_accumulator", None)
        if accumulator is not None:  # aiokafka's: the one way to end a batch's linger at once
            await accumulator.flush_for_commit()
        await asyncio.gather(*sends)

    def _fail(self, failure: TransactionFailed) -> None:
        self._closed = True
        self._failure = failure

    async def close(self, seal: Seal | None = None) -> None:
        """Commit what is open and stop the producer (the partition was handed back, or the worker stops).

        A commit already under way (the periodic one) is waited for: stopping the producer
        under it would leave it waiting for an answer that never comes."""
        async with self._committing:
            try:
                await self._commit_unlocked(seal)
            finally:
                self._closed = True
                if self._commit is not None and not self._commit.done():
                    self._commit.set_exception(NotOwned(f"partition {self.partition} was handed back"))
                    self._commit.exception()
                await self.producer.stop()


def _refused(sends: list[tuple[Awaitable[Any], Position | None]]) -> tuple[Position, ...]:
    """The culprits of the sends the broker refused for the record itself (RECORD_ERRORS)."""
    culprits = []
    for pending, culprit in sends:
        if culprit is None or not isinstance(pending, asyncio.Future) or not pending.done() or pending.cancelled():
            continue
        if isinstance(pending.exception(), RECORD_ERRORS):
            culprits.append(culprit)
    return tuple(culprits)


ProducerFactory = Callable[[str], TransactionalProducer]
"""Makes the transactional producer for a `transactional.id`."""


class Transactions:
    """The open transactions of the partition numbers this worker owns."""

    def __init__(self, app_id: str, new_producer: ProducerFactory, timeout_s: float) -> None:
        self.app_id = app_id
        self.new_producer = new_producer
        self.timeout_s = timeout_s
        self._open: dict[int, PartitionTransaction] = {}

    def transactional_id(self, partition: int) -> str:
        return f"{self.app_id}-{partition}"

    def of(self, partition: int) -> PartitionTransaction:
        try:
            return self._open[partition]
        except KeyError:
            raise NotOwned(f"partition {partition} is not owned by this worker (no open transaction)") from None

    @property
    def partitions(self) -> list[int]:
        return sorted(self._open)

    async def assign(self, partitions: set[int]) -> None:
        """Open transactions for newly owned partition numbers (fencing their previous owners).

        Must finish before the partitions' changelogs are read: the fencing aborts what a
        previous owner left open, so recovery reads only committed writes."""
        new = {
            p: PartitionTransaction(p, self.new_producer(self.transactional_id(p)), self.timeout_s)
            for p in partitions
            if p not in self._open
        }
        if not new:
            return
        results = await asyncio.gather(*(t.start() for t in new.values()), return_exceptions=True)
        failed = [(p, r) for p, r in zip(new, results, strict=True) if isinstance(r, BaseException)]
        for partition, transaction in new.items():
            self._open[partition] = transaction
        if failed:
            partition, exc = failed[0]
            hint = ""
            if "Authorization" in type(exc).__name__:
                hint = (
                    f"; grant WRITE and DESCRIBE on the transactional ids {self.app_id}- (prefixed): "
                    "`faust -A dlqapp acls` prints the grants"
                )
            raise TransactionFailed(
                f"transactional producer of partition {partition} ({self.transactional_id(partition)}) "
                f"did not start: {type(exc).__name__}: {exc}{hint}"
            ) from exc

    async def revoke(self, partitions: set[int], seal: Seal | None = None) -> None:
        """Commit and close the transactions of partition numbers handed back."""
        closing = [self._open.pop(p) for p in sorted(partitions) if p in self._open]
        results = await asyncio.gather(*(t.close(seal) for t in closing), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise TransactionFailed(
                f"a transaction of a partition handed back was not committed: {failed[0]}"
            ) from failed[0]

    def busy(self) -> list[PartitionTransaction]:
        """The open transactions that hold outputs (or steps about to add some)."""
        return [t for t in self._open.values() if t.has_outputs or t.barrier.inside]

    async def commit_all(self, seal: Seal | None = None) -> int:
        """Commit every open transaction that holds outputs; returns how many committed."""
        busy = self.busy()
        if not busy:
            return 0
        results = await asyncio.gather(*(t.commit(seal) for t in busy), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        return len(busy)

    async def close(self, seal: Seal | None = None) -> None:
        """Commit and close every transaction (the worker stops)."""
        await self.revoke(set(self._open), seal)
