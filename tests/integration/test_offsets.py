"""Commits follow what was handled, also over offsets that hold no record.

Input written with transactions leaves a commit marker after each transaction: an offset
the worker is never handed. dlqapp does not commit past an offset it did not handle
without asking Kafka whether a record is there (dlqapp.worker.faust_compat.StrictHeadCommits),
so this checks that markers neither stall the commits nor lose a request.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from tests.support import Worker, keys_seen, read_topic, all_keys_seen, request_bytes, unique, unique_ids, wait_until

PARTITIONS = 3


def produce_in_transactions(bootstrap: str, topic: str, ids: list[str], per_transaction: int) -> None:
    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique("txn"))
        await producer.start()
        try:
            for i in range(0, len(ids), per_transaction):
                async with producer.transaction():
                    for rid in ids[i : i + per_transaction]:
                        await producer.send(topic, request_bytes(rid), key=rid.encode())
        finally:
            await producer.stop()

    asyncio.run(run())


def committed_and_end(bootstrap: str, group: str, topic: str) -> list[tuple[int, int]]:
    async def run() -> list[tuple[int, int]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            ends = await consumer.end_offsets(tps)
            return [((await consumer.committed(tp)) or 0, ends[tp]) for tp in tps]
        finally:
            await consumer.stop()

    return asyncio.run(run())


def test_transaction_markers_in_input_neither_stall_commits_nor_lose_a_request(kafka_bootstrap, tmp_path):
    worker = Worker(kafka_bootstrap, tmp_path, env_extra={"DLQ_SIMULATED_SUCCESS_RATE": "1.0"}).start()
    try:
        first = unique_ids("txn-a", 60)
        produce_in_transactions(kafka_bootstrap, worker.topic("input"), first, per_transaction=5)
        read_topic(kafka_bootstrap, worker.topic("results"), all_keys_seen(set(first)), timeout=120)
        # Once the first lot is done, its last marker sits at (or just behind) each partition's
        # committed offset; a second lot must be committed over it.
        second = unique_ids("txn-b", 60)
        produce_in_transactions(kafka_bootstrap, worker.topic("input"), second, per_transaction=5)
        results = read_topic(kafka_bootstrap, worker.topic("results"), all_keys_seen(set(first + second)), timeout=120)
        assert set(first + second) <= keys_seen(results)
        # Every partition's commit reaches its last record: at most the final marker is left.
        wait_until(
            lambda: all(end - committed <= 1 for committed, end in committed_and_end(kafka_bootstrap, worker.app_id, worker.topic("input"))),
            90,
            "input commits past every marker",
            interval=1.0,
        )
    finally:
        worker.kill()
