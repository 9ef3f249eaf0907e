"""Replicated topics: DLQ_REPLICATION_FACTOR and DLQ_MIN_INSYNC_REPLICAS on dlqapp's
topics and Faust's changelogs, and the refusal when the cluster is too small."""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from tests.kafka_io import all_keys_seen, produce, read_topic, request_bytes
from tests.support import Workers, unique_ids

TABLES = ("parked-retries", "requests", "dead-letters", "dead-letters-by-time", "replay-ledger", "stats", "progress")


async def shapes(bootstrap: str, topics: list[str]) -> dict[str, tuple[int, str]]:
    """Topic → (fewest replicas of a partition, min.insync.replicas)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
        replicas = {d["topic"]: min(len(p["replicas"]) for p in d["partitions"]) for d in described}
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in topics])
        min_isr = {
            r[3]: dict((e[0], e[1]) for e in r[4])["min.insync.replicas"] for resp in responses for r in resp.resources
        }
        return {t: (replicas[t], min_isr[t]) for t in topics}
    finally:
        await admin.close()


async def topic_config(bootstrap: str, topic: str) -> dict[str, str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        return {e[0]: e[1] for r in response.resources for e in r[4]}
    finally:
        await admin.close()


async def create_topic(bootstrap: str, name: str, configs: dict[str, str], replicas: int = 1) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 3, replicas, topic_configs=configs)])
    finally:
        await admin.close()


def test_on_three_brokers_every_topic_and_changelog_has_three_replicas_and_min_insync_two(kafka_cluster, tmp_path):
    worker = Workers(kafka_cluster.bootstrap, tmp_path).make(env_extra={"DLQ_REPLICATION_FACTOR": "3"})
    try:
        worker.start()
        ids = unique_ids("rf", 5)
        produce(
            kafka_cluster.bootstrap,
            worker.topic("input"),
            [(rid.encode(), request_bytes(rid, metadata={"simulate": {"fail_times": 0}})) for rid in ids],
        )
        read_topic(kafka_cluster.bootstrap, worker.topic("results"), all_keys_seen(set(ids)), timeout=120)
        own = [
            worker.topic(n)
            for n in ("input", "retry-1s", "retry-10s", "retry-1m", "dlq", "results", "dlqapp-due", "dlqapp-commands")
        ]
        changelogs = [f"{worker.app_id}-{t}-changelog" for t in TABLES]
        found = asyncio.run(shapes(kafka_cluster.bootstrap, own + changelogs))
        assert found == {t: (3, "2") for t in own + changelogs}
    finally:
        worker.kill()


def test_a_replication_factor_above_the_brokers_is_refused_naming_the_setting(make_worker):
    worker = make_worker(env_extra={"DLQ_REPLICATION_FACTOR": "2"})
    worker.start(wait=False)
    assert worker.process.wait(timeout=120) == 3
    log = worker.log_path.read_text()
    assert (
        "refusing to start" in log
        and "DLQ_REPLICATION_FACTOR=2 needs at least 2 brokers" in log
        and "has 1 (ids 1)" in log
    )


def test_an_existing_topic_gets_min_insync_replicas_and_keeps_its_other_settings(make_worker):
    worker = make_worker()
    dlq = worker.topic("dlq")
    asyncio.run(
        create_topic(
            worker.bootstrap,
            dlq,
            {
                "cleanup.policy": "compact",
                "min.insync.replicas": "2",
                "retention.ms": "123456789",
                "max.message.bytes": "20000000",  # room for the largest input record and its headers
            },
        )
    )
    worker.start()
    config = asyncio.run(topic_config(worker.bootstrap, dlq))
    assert (config["min.insync.replicas"], config["cleanup.policy"], config["retention.ms"]) == (
        "1",
        "compact",
        "123456789",
    )
    assert "min_insync_set" in worker.log_path.read_text()
