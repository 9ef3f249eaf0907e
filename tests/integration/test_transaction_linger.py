"""A partition transaction's records linger in the producer until its commit sends them.

Under exactly_once the transactional producers batch for a whole commit interval (nothing
of an open transaction is read before its commit), so a commit must end that linger itself:
waiting for the sends to be delivered first would wait for the linger, past the timeout.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer

from dlqapp.kafka.transactions import PartitionTransaction
from tests.kafka_io import create_topics, read_topic
from tests.support import unique

LINGER_MS = 30_000
"""Far past the transaction's timeout: a commit that waited for it would fail."""


async def _commit_lingering(bootstrap: str, topic: str, values: list[bytes]) -> int:
    """Send `values` in one partition transaction whose producer lingers LINGER_MS, commit,
    then strike once (its own transaction); returns the number of periodic commits made."""
    await create_topics(bootstrap, topic)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=unique("linger-txn"),
        enable_idempotence=True,
        acks="all",
        linger_ms=LINGER_MS,
    )
    transaction = PartitionTransaction(0, producer, timeout_s=5)
    await transaction.start()
    try:
        await transaction.barrier.enter()
        try:
            for value in values:
                await transaction.send(topic, b"k", value, 0, None)
        finally:
            await transaction.barrier.leave()
        await transaction.commit()
        await transaction.strike([(topic, b"k", b"strike")])  # a culprit's strike, in a transaction of its own
        return transaction.commits
    finally:
        await transaction.close()


def test_a_commit_sends_the_records_its_producer_holds_back(kafka_bootstrap):
    topic = unique("linger")
    values = [f"record-{n}".encode() for n in range(5)]
    assert asyncio.run(_commit_lingering(kafka_bootstrap, topic, values)) == 1
    records = read_topic(kafka_bootstrap, topic, lambda seen: len(seen) > len(values), timeout=30, partitions=1)
    assert [record.value for record in records] == [*values, b"strike"]
