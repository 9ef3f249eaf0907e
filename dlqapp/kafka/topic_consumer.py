"""A consumer of one topic, assigned by hand, that never asks for the whole cluster's metadata."""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition


class TopicConsumer(AIOKafkaConsumer):
    """aiokafka's consumer (no group, partitions assigned by hand) whose client always tracks `topic`.

    An aiokafka client that tracks no topic asks for the metadata of every topic in the
    cluster at each refresh, and decodes it on the event loop: on a broker with a few
    thousand partitions that took 0.2-0.7 s, during which every due retry waited. A client
    tracks no topic between its start and its first assignment, and again after an empty
    assignment (a tail read that stopped reading): both are avoided here."""

    def __init__(self, topic: str, **options: Any) -> None:
        super().__init__(**options)
        self.topic = topic
        self._client.set_topics([topic])

    def assign(self, partitions: list[TopicPartition]) -> None:
        super().assign(partitions)
        if not partitions:
            self._client.set_topics([self.topic])  # before the refresh it asked for runs
