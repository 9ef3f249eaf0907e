"""Stream steps: what one handler writes and sends for its event, carried to Kafka as one unit.

A step opens when a handler starts on an event and ends when the handler returns or fails.
Inside it, table writes (`ConfirmedTable`) go to the partition's RocksDB at once and their
changelog records stay with the step; `send` hands its outputs to the producer; `count`
moves the partition's counters. When the step ends, its changelog records follow its
outputs (one per key, the last value written), and its counts join the partition's:

- under exactly_once every output joins the partition's open transaction, and the step's
  `committed` resolves once that transaction has committed. Each transaction is sealed
  before it commits with the partition's counts and progress (where each topic's handling
  stands, dlqapp.tables.progress), so counts and progress commit with the outputs that
  moved them;
- under at_least_once every record is confirmed by the broker before the step ends
  (`committed` is None); the counts are written at the end of a step, at most every
  `Counters.FLUSH_INTERVAL_S` while other steps of the partition run.

Acking the step's event is not done here: the one ack rule is dlqapp.kafka.acks.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiokafka.errors import KafkaError, MessageSizeTooLargeError

from dlqapp.core.errors import StopWorker
from dlqapp.kafka.transaction_errors import Position, RecordTooLarge, TransactionFailed
from dlqapp.kafka.transactions import PartitionTransaction, Transactions
from dlqapp.tables.counters import Counters
from dlqapp.tables.step import OnEnd, Step, StepContext, StepTable, after_commit

log = logging.getLogger(__name__)

PlainSend = Callable[[str, bytes, bytes | None, int, Any], Awaitable[Awaitable[Any]]]
"""`send(topic, key, value, partition, headers)` on a producer outside any transaction;
returns what resolves once the broker has the record."""


class StreamSteps:
    """Opens stream steps and carries their work to Kafka (module doc)."""

    def __init__(
        self,
        context: StepContext,
        *,
        transactions: Transactions | None,
        send: PlainSend,
        counters: Counters,
        seal_tables: Callable[[int], list[tuple[StepTable, bytes, bytes]]] = lambda partition: [],
        strikes: Callable[[int, tuple[Position, ...]], list[tuple[str, bytes, bytes]]] = lambda p, culprits: [],
    ) -> None:
        """`transactions`: the partitions' transactions under exactly_once (None: at_least_once);
        `send`: the plain producer's send (at_least_once outputs and changelog records);
        `seal_tables(partition)`: the records a transaction of `partition` ends with, beyond
        the counts (the progress of dlqapp.tables.progress); `strikes(partition, culprits)`:
        the records that tell the partition's next owner which records broke a transaction."""
        self.context = context
        self.transactions = transactions
        self._send = send
        self.counters = counters
        self._seal_tables = seal_tables
        self._strikes = strikes
        self._open: Counter[int] = Counter()

    @property
    def exactly_once(self) -> bool:
        return self.transactions is not None

    def open_count(self, partition: int) -> int:
        """Steps of `partition` that have not yet ended (the caller's own included)."""
        return self._open[partition]

    @asynccontextmanager
    async def step(
        self, partition: int, position: Position | None = None, on_end: OnEnd | None = None
    ) -> AsyncIterator[Step]:
        """Run the block as one stream step of `partition` (the event's partition).

        On leaving, the step's work is handed over (above) whether the block succeeded,
        failed or was cancelled: its table writes are in RocksDB already. Under exactly_once a
        block that failed after its first output spoils its transaction, which then never
        commits (the worker restarts): part of a step must never become visible.

        `on_end(committed)` hears that a block that succeeded has handed its work over, with
        what resolves at its commit (None: nothing to wait for). Under exactly_once it is
        called inside the transaction, before a commit can seal it: the partition's progress
        sealed into a transaction then always knows the events whose outputs it holds."""
        step = Step(partition, position, on_end)
        token = self.context.enter(step)
        self._open[partition] += 1
        failed = True
        try:
            yield step
            failed = False
        finally:
            try:
                self._end_inside(step)
            finally:
                self._leave(partition)
                self.context.leave(token)
            # Shielded: a cancellation must not stop the hand-over halfway (the result sent,
            # its state not), and the step's after-sent hooks must run.
            await asyncio.shield(self._hand_over(step, failed))

    def _end_inside(self, step: Step) -> None:
        """at_least_once, still inside the step: its counts join the partition's and are
        written when due (a table write of the step). Under exactly_once they join once the
        step is inside its transaction (`_into_transaction`)."""
        if not self.exactly_once:
            self._merge_counts(step)
            self.counters.flush_due(step.partition, self.open_count(step.partition))

    def _merge_counts(self, step: Step) -> None:
        self.counters.merge(step.partition, step.counts)
        step.counts = Counter()

    def _leave(self, partition: int) -> None:
        self._open[partition] -= 1
        if not self._open[partition]:
            del self._open[partition]

    async def _hand_over(self, step: Step, failed: bool) -> None:
        try:
            if self.transactions is not None:
                await self._into_transaction(step, failed)
            elif failed:
                await self._send_unconfirmed(step)
            else:
                await self._confirm(step)
            if not failed and step.on_end is not None and step.transaction is None:
                step.on_end(step.committed)  # nothing in a transaction: nothing to seal it with
        finally:
            hooks, step.after_sent = step.after_sent, []
            for hook in hooks:
                hook()

    # -- outputs ----------------------------------------------------------------------

    async def send(self, topic: str, key: bytes, value: bytes | None, partition: int, headers: Any) -> Awaitable[Any]:
        """Send one output of the current step; returns what resolves once it is safe.

        Under exactly_once it joins the step's partition transaction and is already
        resolved: the commit the step's event waits for checks every send of the
        transaction. Under at_least_once it resolves when the broker has it."""
        step = self.context.required(f"an output to {topic}")
        if self.transactions is None:
            try:
                pending = await self._send(topic, key, value, partition, headers)
            except MessageSizeTooLargeError as exc:
                raise RecordTooLarge(f"a record for {topic} is too large for the producer: {exc}") from exc
            except KafkaError as exc:
                raise StopWorker(f"a send to {topic} failed: {type(exc).__name__}: {exc}") from exc
            step.futures.append(pending)
            return pending
        transaction = await self._enter(step)
        await transaction.send(topic, key, value, partition, headers, culprit=step.position)
        step.sent = True
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def after_sent(self, hook: Callable[[], None]) -> None:
        """Run `hook` once the current step has handed its table writes to the producer,
        failed or not (at once outside a step).

        A step's changelog records carry the values it wrote and are sent when it ends:
        another step writing the same keys must not send its records first, or the
        changelog would end on the older value. A request's next attempt waits for this."""
        step = self.context.current()
        if step is None:
            hook()
        else:
            step.after_sent.append(hook)

    # -- exactly_once -----------------------------------------------------------------

    async def _enter(self, step: Step) -> PartitionTransaction:
        """The step's partition transaction, entered once per step (a commit waits for it to leave)."""
        if step.transaction is None:
            assert self.transactions is not None
            transaction = self.transactions.of(step.partition)
            await transaction.barrier.enter()
            step.transaction = transaction
        return step.transaction

    async def _into_transaction(self, step: Step, failed: bool) -> None:
        if (step.records or step.counts) and step.transaction is None:
            await self._enter(step)
        transaction = step.transaction
        if transaction is None:
            return
        # Inside the transaction now: the counts join the partition's, to be sealed into the
        # same transaction as the states that moved them.
        counted = bool(step.counts)
        self._merge_counts(step)
        try:
            if failed and step.sent:
                transaction.spoil(
                    f"a step of partition {step.partition} failed after it sent outputs", culprit=step.position
                )
            sent = [
                (table, await transaction.send(table.changelog_topic_name, key, value, step.partition, None))
                for (table, key), value in step.records.items()
            ]
            step.records = {}
            step.sent = step.sent or bool(sent)
            if step.sent or counted:
                step.committed = transaction.committed()
            if not failed and step.on_end is not None:
                step.on_end(step.committed)  # before a commit can seal this transaction
        finally:
            await transaction.barrier.leave()
        if step.committed is not None:
            partition = step.partition
            after_commit(step.committed, lambda: _note_persisted(sent, partition))

    async def commit_all(self) -> int:
        """Seal and commit every open transaction that holds outputs; returns how many."""
        assert self.transactions is not None
        busy = self.transactions.busy()
        results = await asyncio.gather(*(self._commit(t) for t in busy), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        return len(busy)

    async def _commit(self, transaction: PartitionTransaction) -> None:
        try:
            await transaction.commit(self._seal)
        except TransactionFailed as failure:
            await self._strike(transaction, failure)
            raise

    async def _strike(self, transaction: PartitionTransaction, failure: TransactionFailed) -> None:
        """Name the records that broke the transaction in a transaction of their own (a record
        named twice is dead-lettered as poison instead of being handled a third time)."""
        records = self._strikes(transaction.partition, failure.culprits) if failure.culprits else []
        if not records:
            return
        try:
            await transaction.strike(records)
            log.warning("records that broke a transaction of partition %s: %s", transaction.partition, failure.culprits)
        except Exception as exc:  # the producer is gone too (fenced): the next failure names them
            log.warning("records that broke a transaction not noted: %r", exc)

    async def revoke(self, partitions: set[int]) -> None:
        """Seal, commit and close the transactions of partition numbers handed back."""
        if self.transactions is not None:
            await self.transactions.revoke(partitions, self._seal)  # a failure here restarts the worker

    async def _seal(self, transaction: PartitionTransaction) -> None:
        """The last records of a transaction: the partition's counts and progress, written
        to the local tables and sent into the transaction (no step is inside it now)."""
        partition = transaction.partition
        counts = self.counters.unwritten(partition)
        records = [*self._seal_tables(partition), *counts]
        sent = []
        for table, key, value in records:
            table.put_local(partition, key, value)
            sent.append((table, await transaction.send(table.changelog_topic_name, key, value, partition, None)))
        if counts:
            self.counters.written(partition, counts)
        if sent:
            after_commit(transaction.committed(), lambda: _note_persisted(sent, partition))

    # -- at_least_once ----------------------------------------------------------------

    async def _confirm(self, step: Step) -> None:
        while step.records or step.futures:
            records, step.records = step.records, {}
            sent = [
                (table, await self._send(table.changelog_topic_name, key, value, step.partition, None))
                for (table, key), value in records.items()
            ]
            futures, step.futures = step.futures, []
            try:
                await asyncio.gather(*futures, *(future for _, future in sent))
            except KafkaError as exc:  # the broker refused or lost them: not the record's fault
                raise StopWorker(f"the broker did not confirm a step's records: {type(exc).__name__}: {exc}") from exc
            _note_persisted(sent, step.partition)

    async def _send_unconfirmed(self, step: Step) -> None:
        """A failed (or cancelled) step's writes are in RocksDB already: queue their records
        all the same, so the changelog does not fall behind the store (its event is not
        acked as done)."""
        try:
            for (table, key), value in step.records.items():
                await self._send(table.changelog_topic_name, key, value, step.partition, None)
        except Exception as exc:
            log.warning("changelog records of a failed step not sent: %r", exc)

    async def write_unwritten_counts(self) -> None:
        """at_least_once, on a rebalance or a shutdown: write every partition's counts no step
        is left to write, straight to the changelog (the next owner starts from them)."""
        by_partition: dict[int, list[tuple[Any, bytes, bytes | None]]] = {}
        for partition, table, key, value in self.counters.all_unwritten():
            by_partition.setdefault(partition, []).append((table, key, value))
        for partition, records in by_partition.items():
            for table, key, value in records:
                await (await self._send(table.changelog_topic_name, key, value, partition, None))
            self.counters.written_elsewhere(partition)  # all of them, or none should a send fail


def _note_persisted(sent: list[tuple[StepTable, Any]], partition: int) -> None:
    """The changelog holds these writes now: note their offsets (the commit checked every send)."""
    for table, future in sent:
        metadata = future.result() if hasattr(future, "result") else None
        offset = getattr(metadata, "offset", None)
        if isinstance(offset, int):
            table.persisted(partition, offset)
