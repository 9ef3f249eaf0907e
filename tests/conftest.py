"""Session fixtures: one real Kafka broker for the whole run, workers per test, and a
three-broker cluster for the tests that need one (started on first use)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tests.cluster import LocalCluster
from tests.support import LocalKafka, Worker, free_port


def pytest_itemcollected(item: pytest.Item) -> None:
    """Under `pytest -n N --dist loadgroup` (make test): a file runs on one xdist worker,
    so its module fixtures start once, and every test that needs the three-broker cluster
    shares one worker, so the cluster starts once (and no two scenarios share it at once).
    Marked as each test is collected, before xdist reads the groups."""
    group = "kafka_cluster" if "kafka_cluster" in getattr(item, "fixturenames", ()) else item.nodeid.split("::")[0]
    item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """KAFKA_BOOTSTRAP if set, else a broker started with scripts/kafka-local on a free port."""
    existing = os.environ.get("KAFKA_BOOTSTRAP")
    if existing:
        yield existing
        return
    data_dir = Path(tempfile.mkdtemp(prefix="dlqapp-kafka-"))
    broker = LocalKafka(port=free_port(), data_dir=data_dir)
    env = broker.env()
    broker.run("start", env)
    try:
        yield broker.bootstrap
    finally:
        broker.run("stop", env, check=False)
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[LocalCluster]:
    """Three brokers and a controller (scripts/kafka-local, KAFKA_BROKERS=3), shared by
    every test that asks for them; stopped, and checked gone, at the end of the session.

    KAFKA_CLUSTER_DATA_DIR and KAFKA_CLUSTER_PORT point at a cluster you run yourself
    (`KAFKA_BROKERS=3 KAFKA_PORT=<port> KAFKA_DATA_DIR=<dir> scripts/kafka-local start`);
    it is started if down and left running.
    """
    own = os.environ.get("KAFKA_CLUSTER_DATA_DIR")
    data_dir = Path(own) if own else Path(tempfile.mkdtemp(prefix="dlqapp-cluster-"))
    cluster = LocalCluster(data_dir, port=int(os.environ.get("KAFKA_CLUSTER_PORT", "0")))
    took = cluster.start()
    print(f"\nthree-broker cluster on {cluster.bootstrap} ready in {took:.1f}s")
    try:
        yield cluster
    finally:
        if not own:
            cluster.run("stop", check=False)
            left = cluster.pids()
            shutil.rmtree(data_dir, ignore_errors=True)
            assert not left, f"scripts/kafka-local stop left brokers running: {left}"


@pytest.fixture
def make_worker(kafka_bootstrap: str, tmp_path: Path) -> Iterator:
    """Factory of workers sharing this test's tmp dir; every one is stopped at the end."""
    workers: list[Worker] = []

    def make(**kwargs) -> Worker:
        worker = Worker(kafka_bootstrap, tmp_path, name=kwargs.pop("name", f"w{len(workers) + 1}"), **kwargs)
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.kill()
