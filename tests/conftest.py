"""Session fixtures: one real Kafka broker for the whole run, workers per test or per
module, and a three-broker cluster for the tests that need one (started on first use)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster import LocalCluster
from tests.support import LocalKafka, Worker, Workers, free_port


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
def make_worker(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """`make_worker(env_extra=..., app_id=..., prefix=..., name=...)`: a worker, not yet
    started, in this test's tmp dir; every one is killed at the end of the test."""
    workers = Workers(kafka_bootstrap, tmp_path)
    yield workers.make
    workers.kill_all()


@pytest.fixture(scope="module")
def start_worker(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Worker]]:
    """`start_worker(**env)`: a worker with its own app id and topics, `env` added to its
    environment, started and ready; every one lives until the end of the module, then is
    killed. A module's shared worker is one line:

        @pytest.fixture(scope="module")
        def worker(start_worker):
            return start_worker(DLQ_SIMULATED_SUCCESS_RATE="1.0")
    """
    workers = Workers(kafka_bootstrap, tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]))
    yield workers.start
    workers.kill_all()
