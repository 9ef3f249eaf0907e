"""The Faust and RocksDB internals dlqapp relies on, in one place.

Each helper names the private member it touches and why. Checked against
faust-streaming 0.15.3 and rocksdict 0.3; read these first after an upgrade.

Elsewhere, four overrides of Faust hooks (dlqapp.worker.app): `_settings_extra` of the
aiokafka producer (idempotence), `App._new_producer` (to use that producer),
`App._new_consumer` (to use `consumer_with_fetch_wait`) and
`App._on_partitions_revoked` (to hand work back before Faust waits for acks); and the
`_loads` of Faust's JSON codec (dlqapp.worker.topology).
"""

from __future__ import annotations

from typing import Any, Iterator

from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from rocksdict import ReadOptions


def forget_unacked(app: Any, event: Any) -> None:
    """Hand an event back without acking it, so its offset is never committed.

    `Consumer._unacked_messages` is what `wait_empty()` waits on during shutdown and
    rebalances; an event dlqapp gave up on (held by the breaker when the worker stops)
    must leave it, or the worker waits forever. Its offset stays uncommitted, so the
    partition's next owner handles it again.
    """
    consumer = getattr(app, "_consumer", None)
    if consumer is not None:
        consumer._unacked_messages.discard(event.message)


def partition_db(table: Any, partition: int) -> Any:
    """The `rocksdict.Rdict` of one table partition (`Store._db_for_partition`): Faust has no range scan."""
    return table.data._db_for_partition(partition)


def is_offset_record(table: Any, key: bytes) -> bool:
    """Faust keeps each partition's changelog offset inside the partition's RocksDB (`Store.offset_key`)."""
    return key == table.data.offset_key


def keys_with_prefix(db: Any, prefix: bytes, limit: int) -> Iterator[bytes]:
    """Up to `limit` keys of `db` that start with `prefix`, in key order."""
    it = db.iter(ReadOptions())
    it.seek(prefix)
    found = 0
    while it.valid() and found < limit:
        key = it.key()
        if not key.startswith(prefix):
            return
        yield key
        found += 1
        it.next()


def active_partitions(table: Any) -> list[int]:
    """Partitions of `table` this worker actively owns (standbys excluded)."""
    changelog = table.changelog_topic.get_topic_name()
    return sorted(tp.partition for tp in table.app.assignor.assigned_actives() if tp.topic == changelog)


def read_partition(table: Any, partition: int, key: bytes) -> bytes | None:
    """One key of one table partition, read outside a stream (no stale standby copy)."""
    return partition_db(table, partition).get(key)


def scan_chunk(db: Any, after: bytes | None, limit: int, values: bool = True) -> list[tuple[bytes, Any]]:
    """Up to `limit` (key, value) pairs after `after` (exclusive), in key order (value None unless `values`)."""
    it = db.iter(ReadOptions())
    if after is None:
        it.seek_to_first()
    else:
        it.seek(after)
        if it.valid() and it.key() == after:
            it.next()
    chunk = []
    while it.valid() and len(chunk) < limit:
        chunk.append((it.key(), it.value() if values else None))
        it.next()
    return chunk


def consumer_lag(app: Any, topics: set[str]) -> list[tuple[str, int, int]]:
    """(topic, partition, log end offset minus committed offset) for `topics`.

    Faust keeps the committed offsets it knows in `Consumer._committed_offset`.
    """
    consumer = app.consumer
    lag: list[tuple[str, int, int]] = []
    try:
        assigned = consumer.assignment()
    except Exception:  # the consumer has not started yet
        return lag
    for tp in assigned:
        if tp.topic not in topics:
            continue
        try:
            high = consumer.highwater(tp)
        except Exception:  # not fetched yet
            continue
        if high is not None:
            lag.append((tp.topic, tp.partition, max(0, high - (consumer._committed_offset.get(tp) or 0))))
    return lag


def crash(app: Any, exc: BaseException) -> None:
    """Stop the app the way Faust stops it on an agent crash (`App._crash`), without acking."""
    app._crash(exc)


def values_newest_first(table: Any, partition: int) -> Iterator[bytes]:
    """The values of one table partition in descending key order (a lazy RocksDB walk)."""
    it = partition_db(table, partition).iter(ReadOptions())
    it.seek_to_last()
    while it.valid():
        if not is_offset_record(table, it.key()):
            yield it.value()
        it.prev()


async def set_topic_paused(app: Any, topic: str, paused: bool) -> None:
    """Pause (or resume) fetching every assigned partition of `topic`, at the aiokafka level.

    Not `Consumer.pause_partitions`: that edits Faust's active-partition set in place, and
    records of a paused partition already fetched in the current batch are then skipped
    without ever reaching a stream (offsets advanced, never handled until a restart).
    aiokafka's own pause drops its prefetched records and keeps the position, so nothing is
    skipped. The aiokafka consumer lives in Faust's consumer thread (`Consumer._thread`,
    `_ensure_consumer()`), so the call runs there.
    """
    from aiokafka import TopicPartition

    consumer = getattr(app, "_consumer", None)
    thread = getattr(consumer, "_thread", None)
    if thread is None:
        return

    async def apply() -> None:
        aio = thread._ensure_consumer()
        mine = [TopicPartition(tp.topic, tp.partition) for tp in aio.assignment() if tp.topic == topic]
        if paused:
            aio.pause(*mine)
        else:
            aio.resume(*mine)

    await thread.call_thread(apply)


class _FetchWaitConsumerThread(AIOKafkaConsumerThread):
    fetch_max_wait_ms = 1500

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = self.fetch_max_wait_ms  # read by AIOKafkaConsumer.start() for its Fetcher
        return consumer


def consumer_with_fetch_wait(fetch_max_wait_ms: int) -> type:
    """Faust's aiokafka consumer, with aiokafka's `fetch_max_wait_ms` set.

    Faust passes a fixed `fetch_max_wait_ms=1500` (`AIOKafkaConsumerThread._create_worker_consumer`)
    and has no setting for it. aiokafka leaves a partition out of a fetch while records of
    it are still buffered, and sends no new fetch to a broker until the last one returns,
    so a record written meanwhile (a due retry's hint) waited up to 1.5 s.
    """
    thread_class = type("FetchWaitConsumerThread", (_FetchWaitConsumerThread,), {"fetch_max_wait_ms": fetch_max_wait_ms})

    class FetchWaitConsumer(AIOKafkaConsumer):
        def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
            return thread_class(self, loop=self.loop, beacon=self.beacon)

    return FetchWaitConsumer


def widen_changelog_buffer(producer: Any, max_messages: int) -> None:
    """Let Faust's producer buffer hold `max_messages` table writes before it stops the consumer.

    Faust queues each table write in `Producer.buffer` and, once more than
    `ProducerBuffer.max_messages` (100) wait, stops handing records of every topic to
    the agents until 100 are sent (`Conductor.on_message` -> `wait_until_ebb`). A burst of
    300 retries (five or so writes each) held due retries back that way 0.1-0.35 s at a time,
    with a WARNING each time. dlqapp's handlers already wait for their own writes
    (dlqapp.worker.durability), so the writes pending are bounded by the handlers in flight.
    """
    producer.buffer.max_messages = max_messages
