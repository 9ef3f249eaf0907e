"""scripts/kafka-local: idempotent start, status, graceful stop, clear refusals."""

import socket
import subprocess
from pathlib import Path

import pytest

from tests.support import LocalKafka, free_port


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
