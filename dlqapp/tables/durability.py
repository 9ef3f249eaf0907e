"""Table writes confirmed before the event that made them is acked, at one send each.

Faust buffers each table write as a changelog message and commits offsets after
`producer.flush()`, which drains its own buffer only "at most" for a while: under broker
latency an offset can be committed before the changelog records of the same step are on
the broker, and a `kill -9` then loses them (a parked retry the next owner never sees).
So every handler runs inside `changelog_barrier()`, and its event is acked only once the
broker has confirmed every table write the handler made.

Inside a stream step a `ConfirmedTable` write takes a short path: the value goes into the
partition's RocksDB at once (as Faust does) and its changelog record is kept with the
step; the barrier sends the step's records when the handler is done (one record per key:
the last value written wins) and waits for the broker. Faust's own path for one write
(its producer buffer, a task, sensors, a RocksDB write of the changelog offset per
record) cost about as much as everything else a successful request does. The offset
Faust keeps in each partition's RocksDB (where recovery resumes reading the changelog) is
written at most every `PERSIST_INTERVAL_S` per partition: an older offset is always safe,
recovery then re-reads a few records it already has. Outside a step, and on stores that
are not RocksDB, writes take Faust's path.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import Counter
from collections.abc import Callable
from time import monotonic
from typing import Any

import faust
from faust import current_event

from dlqapp.kafka.faust_tables import local_partition_db, producer_of, send_to_changelog, set_persisted_offset
from dlqapp.kafka.transactions import PartitionTransaction, TransactionFailed, Transactions
from dlqapp.tables.rocksdb_memory import share_memory

log = logging.getLogger(__name__)

PERSIST_INTERVAL_S = 0.2
"""How often, at most, a table partition's changelog offset is written to its RocksDB."""

_end_of_step: list[Callable[[], None]] = []
_open_steps: Counter[int] = Counter()
"""Stream steps running now, per partition number (all topics: they are co-partitioned)."""


def at_end_of_step(hook: Callable[[], None]) -> None:
    """Run `hook` at the end of every stream step, inside it (e.g. to write counters)."""
    _end_of_step.append(hook)


def open_steps(partition: int) -> int:
    """How many stream steps of `partition` have not yet ended, the caller's own included (a
    step that is only waiting for the broker, or for its commit, writes nothing more)."""
    return _open_steps[partition]


class _Step:
    """What one stream step wrote: changelog records still to send, and Faust's own sends;
    under exactly-once, the partition transaction it is inside and whether it sent into it."""

    __slots__ = ("after_sent", "futures", "partition", "records", "sent", "transaction")

    def __init__(self, partition: int | None) -> None:
        self.records: dict[tuple[ConfirmedTable, int, bytes], bytes | None] = {}
        self.futures: list[Any] = []
        self.partition = partition
        self.transaction: PartitionTransaction | None = None
        self.sent = False
        self.after_sent: list[Callable[[], None]] = []

    def run_after_sent(self) -> None:
        hooks, self.after_sent = self.after_sent, []
        for hook in hooks:
            hook()


def after_step_sent(hook: Callable[[], None]) -> None:
    """Run `hook` once the current step has handed its table writes to the producer (at
    once outside a step), failed or not.

    A step's changelog records carry the values it wrote and are sent when it ends: another
    step writing the same keys must not send its records first, or the changelog would end
    on the older value. A request's next attempt waits for this (dlqapp.core.in_flight)."""
    step = _step.get()
    if step is None:
        hook()
    else:
        step.after_sent.append(hook)


_transactions: Transactions | None = None
"""Set under DLQ_PROCESSING_GUARANTEE=exactly_once (`use_transactions`): every output of a
step then goes into its partition's transaction, and the step ends once that committed."""


def use_transactions(transactions: Transactions | None) -> None:
    """Route every step's outputs through `transactions` (None: confirmed sends, at-least-once)."""
    global _transactions
    _transactions = transactions


async def send_in_step(topic: str, key: bytes, value: bytes | None, partition: int, headers: Any) -> Any:
    """Send one output of the current step into its partition's transaction (exactly-once).

    Returns a future that is already resolved: the broker's acknowledgements of the step's
    outputs are checked together by the commit the step waits for, so a step holds its
    transaction open for no broker round trip of its own."""
    step = _step.get()
    if step is None or step.partition is None or _transactions is None:
        raise TransactionFailed(f"an output to {topic} outside a stream step cannot join a transaction")
    transaction = await _enter(step)
    await transaction.send(topic, key, value, partition, headers)
    step.sent = True
    confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    confirmed.set_result(None)
    return confirmed


async def write_to_changelog(table: Any, key: bytes, value: bytes, partition: int) -> None:
    """Write one table record straight to its changelog, outside a stream step (a rebalance or
    a shutdown writing what no step is left to write): into the partition's transaction
    under exactly-once, else confirmed on its own."""
    if _transactions is None:
        await send_to_changelog(table, key, value, partition)
        return
    transaction = _transactions.of(partition)
    await transaction.gate.enter()
    try:
        pending = await transaction.send(table.changelog_topic_name, key, value, partition, None)
    finally:
        await transaction.gate.leave()
    await pending


async def _enter(step: _Step) -> PartitionTransaction:
    """The step's partition transaction, entered once per step (a commit waits for it to leave)."""
    if step.transaction is None:
        assert _transactions is not None and step.partition is not None
        transaction = _transactions.of(step.partition)
        await transaction.gate.enter()
        step.transaction = transaction
    return step.transaction


_step: contextvars.ContextVar[_Step | None] = contextvars.ContextVar("dlqapp_step", default=None)


class ConfirmedTable(faust.Table):
    """A Faust table whose writes in a stream step are confirmed by `changelog_barrier`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._offsets_due: dict[int, int] = {}
        self._offsets_written_at: dict[int, float] = {}

    def _new_store(self) -> Any:
        return share_memory(super()._new_store())

    def get(self, key: Any, default: Any = None) -> Any:
        """Faust's in-stream read (the event's partition), without its sensors and key index."""
        located = _in_stream(self)
        if located is None:
            return super().get(key, default)
        value = located[1].get(key)
        return default if value is None else value

    def __setitem__(self, key: Any, value: Any) -> None:
        if not self._write_in_step(key, value):
            super().__setitem__(key, value)

    def __delitem__(self, key: Any) -> None:
        if not self._write_in_step(key, None):
            super().__delitem__(key)

    def send_changelog(self, *args: Any, **kwargs: Any) -> Any:
        future = super().send_changelog(*args, **kwargs)
        step = _step.get()
        if step is not None:
            step.futures.append(future)
        return future

    def _write_in_step(self, key: Any, value: bytes | None) -> bool:
        step = _step.get()
        if step is None or type(key) is not bytes or not (value is None or type(value) is bytes):
            return False  # outside a step, or keys and values Faust must serialize: Faust's path
        located = _in_stream(self)
        if located is None:
            return False
        partition, db = located
        if value is None:
            db.delete(key)
        else:
            db.put(key, value)
        step.records[(self, partition, key)] = value
        return True

    def persisted(self, partition: int, offset: int) -> None:
        """The changelog holds this partition's writes up to `offset`: note it in its RocksDB (throttled)."""
        if offset <= self._offsets_due.get(partition, -1):
            return
        self._offsets_due[partition] = offset
        now = monotonic()
        if now - self._offsets_written_at.get(partition, float("-inf")) < PERSIST_INTERVAL_S:
            return
        self._offsets_written_at[partition] = now
        try:
            set_persisted_offset(self, partition, offset)
        except Exception as exc:  # the partition's store closed meanwhile: an older offset is safe
            log.debug("changelog offset of %s[%s] not noted: %r", self.name, partition, exc)


def _in_stream(table: ConfirmedTable) -> tuple[int, Any] | None:
    """(partition, RocksDB) of the current event, or None outside a stream or off RocksDB."""
    event = current_event()
    if event is None:
        return None
    partition = event.message.partition
    db = local_partition_db(table, partition)
    return None if db is None else (partition, db)


class changelog_barrier:
    """On leaving the block, send the table writes made inside it and wait until the broker has them all.

    Under exactly-once the block ends once its partition's transaction has committed; with
    `wait_for_commit=False` it ends when its outputs are in the transaction, and `committed`
    is what resolves at the commit (None: nothing to wait for), so a caller handling events
    one at a time need not wait a commit interval per event (it acks each one then)."""

    __slots__ = ("_partition", "_step", "_token", "_wait", "committed")

    def __init__(self, wait_for_commit: bool = True) -> None:
        self._wait = wait_for_commit
        self.committed: asyncio.Future[None] | None = None

    async def __aenter__(self) -> None:
        event = current_event()
        self._partition = None if event is None else event.message.partition
        self._step = _Step(self._partition)
        self._token = _step.set(self._step)
        if self._partition is not None:
            _open_steps[self._partition] += 1

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is None:
                for hook in _end_of_step:
                    hook()
            # From here the step writes nothing more: it no longer counts as open (so the last
            # step of a burst writes the counts, while earlier ones still wait for a commit).
            self._leave()
            try:
                if self._step.partition is not None and _transactions is not None:
                    self.committed = await _commit_step(self._step, failed=exc_type is not None)
                elif exc_type is None:
                    await _confirm(self._step)
                else:
                    await _send_unconfirmed(self._step)
            finally:
                self._step.run_after_sent()
            if self._wait and self.committed is not None:
                await self.committed
        finally:
            _step.reset(self._token)
            self._leave()

    def _leave(self) -> None:
        if self._partition is not None:
            _open_steps[self._partition] -= 1
            if not _open_steps[self._partition]:
                del _open_steps[self._partition]
            self._partition = None


async def _confirm(step: _Step) -> None:
    while step.records or step.futures:
        records, step.records = step.records, {}
        sent = [
            (table, partition, await _send(table, key, value, partition))
            for (table, partition, key), value in records.items()
        ]
        futures, step.futures = step.futures, []
        await asyncio.gather(*futures, *(future for _, _, future in sent))
        for table, partition, future in sent:
            table.persisted(partition, future.result().offset)


async def _commit_step(step: _Step, failed: bool) -> asyncio.Future[None] | None:
    """Exactly-once: the step's table writes join its partition's transaction; returns what
    resolves once that transaction has committed (its event may be acked then), or None
    when the step sent nothing.

    A step that failed or was cancelled after it sent outputs leaves the transaction with
    part of its work: it is marked spoiled and never commits (the worker stops)."""
    if step.records:
        await _enter(step)
    transaction = step.transaction
    if transaction is None:
        return None
    committed = None
    try:
        if failed and step.sent:
            transaction.spoil(f"a step of partition {step.partition} failed after it sent outputs")
        records, step.records = step.records, {}
        sent = [
            (table, partition, await transaction.send(table.changelog_topic_name, key, value, partition, None))
            for (table, partition, key), value in records.items()
        ]
        step.sent = step.sent or bool(sent)
        if step.sent and not failed:
            committed = transaction.committed()
    finally:
        await transaction.gate.leave()
    if committed is None:
        return None

    def note_persisted() -> None:  # the commit checked every send first
        for table, partition, future in sent:
            table.persisted(partition, future.result().offset)

    after_commit(committed, note_persisted)
    return committed


def after_commit(committed: asyncio.Future[None] | None, hook: Callable[[], None]) -> None:
    """Run `hook` now when there is no commit to wait for, else once `committed` has
    committed; never when it failed."""
    if committed is None:
        hook()
        return

    def run_hook(done: asyncio.Future[None]) -> None:
        if not done.cancelled() and done.exception() is None:
            hook()

    committed.add_done_callback(run_hook)


async def _send_unconfirmed(step: _Step) -> None:
    """A failed (or cancelled) step's writes are in RocksDB already: queue their records all the
    same, so the changelog does not fall behind the store (the event is not acked as done)."""
    try:
        for (table, partition, key), value in step.records.items():
            await _send(table, key, value, partition)
    except Exception as exc:
        log.warning("changelog records of a failed step not sent: %r", exc)


async def _send(table: ConfirmedTable, key: bytes, value: bytes | None, partition: int) -> Any:
    return await producer_of(table).send(table.changelog_topic_name, key, value, partition, None, None)
