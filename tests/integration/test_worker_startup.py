"""A worker creates its topics, refuses mismatched ones, and refuses bad settings."""

import asyncio
import subprocess

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from tests.support import FAUST


async def describe(bootstrap, topics):
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
        counts = {d["topic"]: len(d["partitions"]) for d in described}
        (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topics[-1])])
        configs = {e[0]: e[1] for r in response.resources for e in r[4]}
        return counts, configs
    finally:
        await admin.close()


async def create(bootstrap, name, partitions):
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()


def test_worker_creates_every_topic_with_the_configured_partitions_and_a_compacted_dlq(make_worker):
    worker = make_worker(env_extra={"DLQ_PARTITIONS": "4", "DLQ_RETRY_DELAYS": "2s,20s"})
    worker.start()
    names = [worker.topic(n) for n in ("input", "retry-2s", "retry-20s", "results", "dlqapp-due", "dlq")]
    counts, dlq_configs = asyncio.run(describe(worker.bootstrap, names))
    assert counts == {name: 4 for name in names}
    assert dlq_configs["cleanup.policy"] == "compact"
    status, body = worker.get("/")
    assert status == 200 and body["ready"] and body["topics"][0] == worker.topic("input")


def test_worker_refuses_a_topic_with_another_partition_count(make_worker):
    worker = make_worker()
    asyncio.run(create(worker.bootstrap, worker.topic("input"), 2))
    worker.start(wait=False)
    code = worker.process.wait(timeout=120)
    assert code != 0
    log = worker.log_path.read_text()
    assert "refusing to start" in log and f"{worker.topic('input')} has 2" in log and "DLQ_PARTITIONS=3" in log


def test_worker_refuses_a_bad_setting_naming_the_variable(make_worker, tmp_path):
    worker = make_worker(env_extra={"DLQ_CONCURRENCY": "lots"})
    result = subprocess.run(
        [str(FAUST), "-A", "dlqapp", "worker"],
        env=worker.env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "DLQ_CONCURRENCY='lots' is invalid" in result.stderr
