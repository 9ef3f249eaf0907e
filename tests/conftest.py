"""Session fixtures: one real Kafka broker for the whole run, workers per test."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tests.support import LocalKafka, Worker, free_port


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
