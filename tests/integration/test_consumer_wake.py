"""A poll waiting for records sees a partition that became active again at once
(dlqapp.kafka.faust_consumer_thread.wake_polls), against a real aiokafka consumer and broker.

Faust takes a partition out of the set its polls read while that partition's stream
buffer is full, and puts it back when the buffer drains; aiokafka wakes a waiting poll only
when a fetch brings records. Records already fetched for the returning partition then
waited for the poll's timeout (a second in a worker): half the time a worker took to read
a flood of 20,000 requests."""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaConsumer, TopicPartition

from dlqapp.kafka.faust_consumer_thread import wake_polls
from tests.kafka_io import create_topics, produce
from tests.support import unique

POLL_TIMEOUT_S = 60.0
"""A poll nobody wakes returns after this; the test fails long before."""
WOKEN_WITHIN_S = 10.0


async def _poll_sees_the_partition_once_woken(bootstrap: str, topic: str) -> tuple[int, float]:
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([tp])
        fetcher = consumer._fetcher
        deadline = time.monotonic() + WOKEN_WITHIN_S
        while tp not in fetcher._records:  # the records fetched and buffered, not yet taken
            assert time.monotonic() < deadline, "the consumer never fetched the records"
            await asyncio.sleep(0.05)
        active: set[TopicPartition] = {TopicPartition(topic, 99)}  # the partition out, as Faust's flow control does
        started = time.monotonic()
        poll = asyncio.ensure_future(fetcher.fetched_records(active, timeout=POLL_TIMEOUT_S))
        await asyncio.sleep(0.2)
        assert not poll.done(), "the poll took records of a partition it was not asked for"
        active.add(tp)  # the buffer drained: the partition is back
        wake_polls(consumer)
        records = await asyncio.wait_for(poll, WOKEN_WITHIN_S)
        return sum(len(batch) for batch in records.values()), time.monotonic() - started
    finally:
        await consumer.stop()


def test_a_waiting_poll_takes_the_records_of_a_partition_back_in_the_active_set_once_woken(kafka_bootstrap):
    topic = unique("wake")
    asyncio.run(create_topics(kafka_bootstrap, topic))
    produce(kafka_bootstrap, topic, [(f"k{i}".encode(), b"v") for i in range(5)])
    taken, took = asyncio.run(_poll_sees_the_partition_once_woken(kafka_bootstrap, topic))
    assert taken == 5
    assert took < POLL_TIMEOUT_S / 2  # woken, not timed out (it fails at WOKEN_WITHIN_S otherwise)
