"""A producer's metadata keeps the topics it writes to when it first writes to a new topic.

aiokafka replaces its topic metadata with each refresh's answer, and asks only for the
topics it was told of, or for all while it was told of none. Faust's producer starts with
such a full refresh (its topic declarations force one), so it is told of none of them, and
lost every topic but a new one (another worker's reply topic) on its first send there:
batches queued for the others had no leader for up to 20 minutes. dlqapp tells it of its
topics at start (`faust_producer.keep_in_metadata`).
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer

from dlqapp.kafka.faust_producer import keep_in_metadata
from tests.kafka_io import create_topics
from tests.support import unique


async def _known_after_a_send_to_a_new_topic(bootstrap: str, keep: bool) -> bool:
    """Whether the producer still knows topic `old` after its first send to a topic created after it started."""
    old, new = unique("meta-old"), unique("meta-new")
    await create_topics(bootstrap, old)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.client.force_metadata_update()  # a full refresh, as Faust's topic declarations make at start
        await producer.send_and_wait(old, b"before")  # known from that refresh, so never "added"
        if keep:
            keep_in_metadata(producer.client, [old])
        await create_topics(bootstrap, new)
        await producer.send_and_wait(new, b"first")
        return producer.client.cluster.partitions_for_topic(old) is not None
    finally:
        await producer.stop()


def test_without_it_a_first_send_to_a_new_topic_drops_the_others(kafka_bootstrap):
    assert asyncio.run(_known_after_a_send_to_a_new_topic(kafka_bootstrap, keep=False)) is False


def test_kept_topics_stay_in_the_metadata(kafka_bootstrap):
    assert asyncio.run(_known_after_a_send_to_a_new_topic(kafka_bootstrap, keep=True)) is True
