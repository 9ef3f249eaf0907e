"""scripts/kafka-local: idempotent start, status, graceful stop, clear refusals; a
three-broker cluster (its brokers are killed and restarted by tests/chaos/test_cluster.py)."""

import asyncio
import socket
import subprocess
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from tests.cluster import LocalCluster
from tests.support import KAFKA_LOCAL, LocalKafka, free_port


def brokers_using(data_dir: Path) -> list[str]:
    out = subprocess.run(["pgrep", "-af", "kafka.Kafka"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(data_dir) in line]


@pytest.fixture
def broker(tmp_path):
    kafka = LocalKafka(port=free_port(), data_dir=tmp_path / "kafka")
    env = kafka.env()
    yield kafka, env
    kafka.run("stop", env, check=False)


def test_start_twice_leaves_one_broker_and_stop_leaves_none(broker):
    kafka, env = broker
    first = kafka.run("start", env)
    assert "ready on" in first.stdout
    second = kafka.run("start", env)
    assert "already running" in second.stdout
    assert len(brokers_using(kafka.data_dir)) == 1
    assert kafka.run("status", env).returncode == 0
    stopped = kafka.run("stop", env)
    assert "stopped" in stopped.stdout
    assert brokers_using(kafka.data_dir) == []
    assert kafka.run("status", env, check=False).returncode == 1


def test_a_taken_port_is_refused_with_a_clear_message(broker):
    kafka, env = broker
    with socket.socket() as s:
        s.bind(("127.0.0.1", kafka.port))
        s.listen()
        result = kafka.run("start", env, check=False)
    assert result.returncode != 0
    assert f"port {kafka.port}" in result.stderr and "KAFKA_PORT" in result.stderr
    assert brokers_using(kafka.data_dir) == []


def test_missing_java_is_reported(broker, tmp_path):
    kafka, env = broker
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "sed", "head", "cat", "dirname", "mkdir", "grep"):
        path = subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip()
        (bin_dir / tool).symlink_to(path)
    result = kafka.run("start", {**env, "PATH": str(bin_dir)}, check=False)
    assert result.returncode != 0 and "java not found" in result.stderr


# -- KAFKA_BROKERS=3 ---------------------------------------------------------------------


async def live_brokers(bootstrap: str) -> list[int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return sorted(b["node_id"] for b in (await admin.describe_cluster())["brokers"])
    finally:
        await admin.close()


def test_a_cluster_of_three_brokers_is_one_cluster_and_starts_idempotently(kafka_cluster):
    again = kafka_cluster.run("start")
    assert "already running (3 brokers)" in again.stdout
    assert len(kafka_cluster.pids()) == 4  # three brokers and the controller
    status = kafka_cluster.run("status")
    assert [f"broker {i} running" in status.stdout for i in (1, 2, 3)] == [
        True
    ] * 3 and "controller running" in status.stdout
    assert asyncio.run(live_brokers(kafka_cluster.bootstrap)) == [1, 2, 3]
    assert kafka_cluster.run("start-broker", "2").stdout.startswith("kafka-local: broker 2 already running")


def test_a_cluster_refuses_a_wrong_broker_number_or_layout(kafka_cluster, tmp_path):
    wrong = kafka_cluster.run("stop-broker", "4", check=False)
    assert wrong.returncode != 0 and "a broker number from 1 to 3" in wrong.stderr
    single = subprocess.run(
        [str(KAFKA_LOCAL), "start"],
        env={**kafka_cluster.env(), "KAFKA_BROKERS": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert single.returncode != 0 and "holds a Kafka of 3 broker(s), not KAFKA_BROKERS=1" in single.stderr
    fresh = LocalCluster(tmp_path / "fresh")
    never = fresh.run("start-broker", "2", check=False)
    assert never.returncode != 0 and "never run here" in never.stderr and fresh.pids() == []
