"""Records at the size limit: any record `input` accepts reaches the DLQ with its bytes intact,
and nothing makes a worker restart in a loop (issue 39, case 3); topics too small for that
stop the worker at start with a message naming them and the setting."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.kafka_io import all_keys_seen, read_topic, request_bytes
from tests.support import unique_ids, wait_until

LIMIT = 1024 * 1024


def produce_to_partition(bootstrap: str, topic: str, partition: int, records: list[tuple[bytes | None, bytes]]) -> None:
    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=2 * LIMIT)
        await producer.start()
        try:
            for key, value in records:  # in order, each acknowledged
                await producer.send_and_wait(topic, value, key=key, partition=partition)
        finally:
            await producer.stop()

    asyncio.run(run())


def test_a_record_at_the_input_limit_is_dead_lettered_intact_and_the_partition_moves_on(make_worker):
    worker = make_worker(env_extra={"DLQ_MAX_MESSAGE_BYTES": str(LIMIT), "DLQ_SIMULATED_SUCCESS_RATE": "1.0"})
    worker.start()
    big = b"\x00not json\xff" + b"x" * (LIMIT - 400 - 11)
    ids = unique_ids("after-big", 20)
    produce_to_partition(
        worker.bootstrap,
        worker.topic("input"),
        0,
        [(None, big), *((rid.encode(), request_bytes(rid)) for rid in ids)],
    )
    read_topic(worker.bootstrap, worker.topic("results"), all_keys_seen(set(ids)), timeout=120)
    dead = read_topic(
        worker.bootstrap, worker.topic("dlq"), lambda records: any(r.value == big for r in records), timeout=60
    )
    (letter,) = [r for r in dead if r.value == big]
    assert letter.headers["error_class"] == "invalid_request"
    log = worker.log_path.read_text()
    assert log.count("] ready console=") == 1, "the worker restarted"
    assert "restarting the worker" not in log


def test_topics_too_small_for_the_largest_input_record_stop_the_worker_naming_them(make_worker):
    worker = make_worker(env_extra={"DLQ_MAX_MESSAGE_BYTES": str(LIMIT)})

    async def create() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=worker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics(
                [NewTopic(worker.topic("dlq"), 3, 1, topic_configs={"cleanup.policy": "compact"})]
            )  # the broker's default size: about 1 MiB, no room for dlqapp's headers
        finally:
            await admin.close()

    asyncio.run(create())
    worker.start(wait=False)
    wait_until(lambda: worker.process.poll() is not None, timeout=60, what="the worker to refuse to start")
    log = worker.log_path.read_text()
    assert worker.process.returncode == 3
    assert worker.topic("dlq") in log and "max.message.bytes" in log and "DLQ_MAX_MESSAGE_BYTES" in log
