"""TopicConsumer: its client never tracks no topic, so a refresh never asks for the whole cluster."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, TopicPartition

from dlqapp.kafka.topic_consumer import TopicConsumer


def tracked(make) -> list[set[str]]:
    """The topics the consumer's client tracks: once built, assigned two partitions, assigned none."""

    async def run():
        consumer = make()
        seen = [set(consumer._client._topics)]
        consumer.assign([TopicPartition("input", 0), TopicPartition("input", 1)])
        seen.append(set(consumer._client._topics))
        consumer.assign([])
        seen.append(set(consumer._client._topics))
        await consumer._client.close()
        return seen

    return asyncio.run(run())


def test_the_client_tracks_its_topic_from_the_start_and_after_an_empty_assignment():
    assert tracked(lambda: TopicConsumer("input", bootstrap_servers="127.0.0.1:1")) == [{"input"}] * 3


def test_aiokafkas_own_consumer_tracks_none_then_and_would_ask_for_every_topic():
    """The behaviour TopicConsumer exists for (a refresh with no topic tracked asks for all)."""
    assert tracked(lambda: AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1")) == [set(), {"input"}, set()]
