"""Driving a system under measurement: topics, requests in (at once, in batches or paced),
outcomes back, and what a worker reports about itself while it runs."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any, Self

from bench.harness import (
    Record,
    Worker,
    all_keys_seen,
    produce,
    read_topic,
    request_bytes,
)
from dlqapp.kafka.admin import ensure_topics
from dlqapp.settings import Settings

BENCH_PARTITIONS = 3
"""Partitions of every topic the bench creates (the baselines' too), as in its earlier figures;
`partitions` measures other counts."""


class SystemDied(AssertionError):
    """The process under measurement exited before every outcome appeared."""


# -- topics and requests ---------------------------------------------------------------


def make_topics(bootstrap: str, prefix: str, partitions: int = BENCH_PARTITIONS) -> Settings:
    """Create dlqapp's topics under `prefix` with `partitions` each; their settings."""
    settings = Settings.from_env(
        {"DLQ_KAFKA_BOOTSTRAP": bootstrap, "DLQ_TOPIC_PREFIX": prefix, "DLQ_PARTITIONS": str(partitions)}
    )
    asyncio.run(ensure_topics(settings))
    return settings


def requests_for(ids: list[str]) -> list[tuple[bytes, bytes]]:
    """Plain requests, keyed by their ids."""
    return [(rid.encode(), request_bytes(rid)) for rid in ids]


def requests_with_plan(ids: list[str], **simulate: Any) -> list[tuple[bytes, bytes]]:
    """Requests the simulated backend treats as scripted (`fail_times`, `error`, `retry_after`)."""
    plan = {"metadata": {"simulate": simulate}}
    return [(rid.encode(), request_bytes(rid, **plan)) for rid in ids]


# -- producing -------------------------------------------------------------------------


def produce_paced(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]], per_second: int) -> None:
    """Produce at a steady rate, a tenth of a second's worth at a time."""
    step = max(1, per_second // 10)
    started = time.monotonic()
    for i in range(0, len(records), step):
        produce(bootstrap, topic, records[i : i + step])
        time.sleep(max(0.0, started + (i + step) / per_second - time.monotonic()))  # pacing, not waiting


def produce_in_batches(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]], batch: int = 10_000) -> None:
    """Produce `records` as fast as the broker takes them, `batch` at a time."""
    for i in range(0, len(records), batch):
        produce(bootstrap, topic, records[i : i + batch])


# -- outcomes --------------------------------------------------------------------------


def wait_results(
    bootstrap: str,
    topic: str | list[str],
    ids: list[str],
    timeout: float,
    alive: Callable[[], bool] | None = None,
    partitions: int = BENCH_PARTITIONS,
) -> list[Record]:
    """The first committed record of each of `ids` on `topic` (read_committed: what a
    downstream consumer of an exactly_once worker sees; the same as read_uncommitted for
    systems without transactions); fails at once should `alive()` turn false."""
    wanted = set(ids)
    complete = all_keys_seen(wanted)

    def until(records: list[Record]) -> bool:
        if alive is not None and not alive():
            raise SystemDied(f"the process under measurement exited with {len(records)} of {len(ids)} outcomes")
        return complete(records)

    records = read_topic(
        bootstrap, topic, until, timeout, partitions=partitions, client={"isolation_level": "read_committed"}
    )
    first: dict[str, Record] = {}
    for record in records:
        key = record.key.decode() if record.key else ""
        if key in wanted and key not in first:
            first[key] = record
    return list(first.values())


# -- what a worker reports -------------------------------------------------------------


def metric_sum(worker: Worker, name: str) -> int:
    """Sum of one of the worker's Prometheus gauges over all its labels."""
    with urllib.request.urlopen(worker.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")))


def parked_gauge(worker: Worker) -> int:
    """Retries the worker has parked (its gauge: cheap to read, unlike the exact count)."""
    return metric_sum(worker, "dlqapp_parked_retries")


class LoopLagSampler:
    """Polls a worker's `dlqapp_event_loop_lag_seconds` twice a second while in use; keeps the worst.

    It asks /metrics for that one gauge: the whole scrape (about 400 series at 12 partitions)
    kept the worker's event loop busy for about 6 ms, twice a second, inside the lateness
    it measures."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.max_ms = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                with urllib.request.urlopen(
                    self.worker.url + "/metrics?name[]=dlqapp_event_loop_lag_seconds", timeout=5
                ) as response:
                    text = response.read().decode()
            except OSError:
                continue
            for line in text.splitlines():
                if line.startswith("dlqapp_event_loop_lag_seconds "):
                    self.max_ms = max(self.max_ms, float(line.split()[1]) * 1000)
