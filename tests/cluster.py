"""A local three-broker Kafka cluster (scripts/kafka-local, KAFKA_BROKERS=3) for tests."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.support import KAFKA_LOCAL

EPHEMERAL_LOW = 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(count: int) -> int:
    """The first of `count` consecutive free ports below the ephemeral range, so that no
    client's outgoing connection can take a stopped broker's port before it restarts."""
    low = (
        int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        if Path("/proc/sys/net/ipv4/ip_local_port_range").exists()
        else EPHEMERAL_LOW
    )
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, max(20_001, low - count))
        if all(_bindable(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports below {low}")


@dataclass
class LocalCluster:
    """`scripts/kafka-local` with KAFKA_BROKERS brokers and a controller on consecutive ports."""

    data_dir: Path
    brokers: int = 3
    port: int = 0

    def __post_init__(self) -> None:
        if not self.port:
            self.port = free_port_block(self.brokers + 1)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.port + i}" for i in range(self.brokers))

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KAFKA_BROKERS": str(self.brokers),
            "KAFKA_PORT": str(self.port),
            "KAFKA_CONTROLLER_PORT": str(self.port + self.brokers),
            "KAFKA_DATA_DIR": str(self.data_dir),
        }

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(KAFKA_LOCAL), *args], env=self.env(), capture_output=True, text=True, timeout=300, check=check
        )

    def start(self) -> float:
        """Start every node; returns the seconds it took."""
        began = time.monotonic()
        self.run("start")
        return time.monotonic() - began

    def kill(self, broker: int) -> None:
        """kill -9 one broker."""
        self.run("kill-broker", str(broker))

    def stop_broker(self, broker: int) -> None:
        self.run("stop-broker", str(broker))

    def start_broker(self, broker: int) -> subprocess.CompletedProcess[str]:
        """Start one broker and wait until it is back in sync (when the others are up)."""
        return self.run("start-broker", str(broker))

    def start_broker_later(self, broker: int) -> subprocess.Popen[str]:
        """`start-broker` in the background: the caller goes on and waits for it later."""
        return subprocess.Popen(
            [str(KAFKA_LOCAL), "start-broker", str(broker)],
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def pids(self) -> list[str]:
        out = subprocess.run(["pgrep", "-af", "kafka.Kafka"], capture_output=True, text=True).stdout
        return [line for line in out.splitlines() if str(self.data_dir) in line]

    def leaders(self, topic: str) -> dict[int, int]:
        """Partition → id of the broker leading it."""
        return asyncio.run(_leaders(self.bootstrap, topic))

    def end_offsets(self, topic: str, partitions: int) -> dict[int, int]:
        return asyncio.run(_end_offsets(self.bootstrap, topic, partitions))


async def _leaders(bootstrap: str, topic: str) -> dict[int, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
        return {p["partition"]: p["leader"] for p in described["partitions"]}
    finally:
        await admin.close()


async def _end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        offsets = await consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
        return {tp.partition: offset for tp, offset in offsets.items()}
    finally:
        await consumer.stop()


async def _out_of_sync(bootstrap: str, prefix: str) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [t for t in await admin.list_topics() if t.startswith(prefix)]
        described = await admin.describe_topics(names) if names else []
        return [
            f"{d['topic']}-{p['partition']}"
            for d in described
            for p in d["partitions"]
            if set(p["isr"]) != set(p["replicas"])
        ]
    finally:
        await admin.close()


def wait_in_sync(cluster: LocalCluster, prefix: str, timeout: float = 180) -> None:
    """Until every partition of the topics named `prefix…` has all its replicas in sync
    (what a rolling restart waits for before it stops the next broker)."""
    deadline = time.monotonic() + timeout
    while lagging := asyncio.run(_out_of_sync(cluster.bootstrap, prefix)):
        assert time.monotonic() < deadline, f"replicas still out of sync after {timeout}s: {lagging[:5]}"
        time.sleep(0.5)
