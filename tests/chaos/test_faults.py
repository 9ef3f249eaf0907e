"""No request is lost across worker kill -9, a broker restart, and losing one of three workers.

Reduced sizes run in `make test`; `make chaos` (CHAOS_FULL=1) runs the full ones.
Each test prints its ledger summary (requests, faults, lost, duplicates, extra calls).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.chaos.ledger import FULL, assert_guarantee, settled_ledger, under_exactly_once
from tests.kafka_io import produce, request_bytes
from tests.support import (
    LocalKafka,
    MockLLM,
    Worker,
    Workers,
    free_port,
    unique,
    wait_until,
)

pytestmark = pytest.mark.timeout(3600 if FULL else 900)  # worker restarts are slow on a busy machine

FAULT_ENV = {
    "DLQ_INFERENCE": "openai",
    "DLQ_INFERENCE_TIMEOUT": "2s",
    "DLQ_RETRY_DELAYS": "200ms,400ms,600ms",
    "DLQ_SESSION_TIMEOUT": "6s",
}

GUARANTEE_ENV = {"DLQ_PROCESSING_GUARANTEE": os.environ.get("DLQ_PROCESSING_GUARANTEE", "at_least_once")}
"""These scenarios run at_least_once whatever the default (tests/chaos/test_exactly_once.py
runs the same faults exactly_once); DLQ_PROCESSING_GUARANTEE=exactly_once runs them so."""


def report(name: str, summary: dict) -> None:
    line = json.dumps({"test": name, **summary})
    print(line)
    if os.environ.get("CHAOS_REPORT"):
        with open(os.environ["CHAOS_REPORT"], "a") as f:
            f.write(line + "\n")


def start_mock(tmp_path) -> MockLLM:
    return MockLLM(
        tmp_path, args=["--latency-ms", "10", "--jitter-ms", "5", "--fail", "503=0.2", "--seed", "11"]
    ).start()


def produce_ids(worker: Worker, count: int, prefix: str) -> list[str]:
    ids = [f"{prefix}-{i}-{unique('x')[-6:]}" for i in range(count)]
    for start in range(0, count, 5000):
        chunk = ids[start : start + 5000]
        produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid)) for rid in chunk])
    return ids


def mock_calls(mock: MockLLM) -> int:
    return mock.stats()["calls"]


def calls_reached(mock: MockLLM, target: int) -> Callable[[], bool]:
    """A `wait_until` predicate: the mock LLM has taken `target` calls."""
    return lambda: mock_calls(mock) >= target


def test_kill_9_five_times_loses_nothing(make_worker, tmp_path):
    count = 100_000 if FULL else 4_000
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "606")))
    mock = start_mock(tmp_path)
    try:
        worker = make_worker(env_extra={**FAULT_ENV, **GUARANTEE_ENV, "DLQ_INFERENCE_URL": mock.api_url}).start()
        ids = produce_ids(worker, count, "kill")
        for kill in range(5):
            target = int(count * (kill + 1) / 6 * rng.uniform(0.8, 1.1))
            wait_until(calls_reached(mock, target), 300, f"{target} backend calls before kill {kill + 1}")
            worker.kill()
            worker.start()
        ledger = settled_ledger(worker, ids, timeout=900)
        summary = {**ledger.summary(mock.url), "kills": 5}
        report("worker kill -9 x5", summary)
        assert_guarantee(ledger, summary, GUARANTEE_ENV)
        window = (
            64 * (4 if under_exactly_once(GUARANTEE_ENV) else 2) * 2
        )  # concurrency x window factor x (input + due agents)
        assert summary["extra_calls"] <= 5 * window, summary
    finally:
        mock.stop()


def test_a_broker_restart_mid_run_loses_nothing(tmp_path):
    count = 20_000 if FULL else 4_000
    broker = LocalKafka(port=free_port(), data_dir=tmp_path / "kafka")
    env = broker.env()
    broker.run("start", env)
    mock = start_mock(tmp_path)
    worker = Workers(broker.bootstrap, tmp_path).make(
        env_extra={**FAULT_ENV, **GUARANTEE_ENV, "DLQ_INFERENCE_URL": mock.api_url}
    )
    try:
        worker.start()
        ids = produce_ids(worker, count, "broker")
        wait_until(lambda: mock_calls(mock) >= count // 3, 300, "a third of the run")
        broker.run("stop", env)
        down_at = time.monotonic()
        broker.run("start", env)
        ledger = settled_ledger(worker, ids, timeout=600)
        summary = {
            **ledger.summary(mock.url),
            "broker_restarts": 1,
            "broker_down_s": round(time.monotonic() - down_at, 1),
        }
        report("broker restart", summary)
        assert_guarantee(ledger, summary, GUARANTEE_ENV)
        assert worker.process.poll() is None, "the worker recovers by itself"
    finally:
        worker.kill()
        mock.stop()
        broker.run("stop", env, check=False)


def summarize_page(body: dict, expected: set) -> str:
    """What a DLQ page shows beside the dead letters the topic holds, for a failure message."""
    shown = {i["request_id"] for i in body.get("items", [])}
    return (
        f"total {body.get('total')}, incomplete {body.get('incomplete')}, "
        f"missing {sorted(expected - shown)[:5]}, extra {sorted(shown - expected)[:5]}"
    )


AT_LEAST_ONCE_COUNT_SLACK = 2
"""How far, under at_least_once, the DLQ total may be from the dead letters listed after one
kill -9: the counts of a partition are written at most every 0.25 s while its other steps
run, so a crash can lose (or, for a step that was not acked, repeat) that interval's."""


def page_listing(worker: Worker, path: str, expected: set[str], *, exact_total: bool) -> Callable[[], Any]:
    """A `wait_until` predicate: `worker`'s DLQ page at `path`, once it lists every one of the
    `expected` dead letters, at least (and, when `exact_total`, its total says as many)."""

    def page() -> Any:
        body = worker.get(path)[1]
        listed = {i["request_id"] for i in body.get("items", [])}
        complete = listed >= expected and (not exact_total or body.get("total") == len(expected))
        return complete and body

    return page


def test_three_workers_lose_one_and_lose_nothing(make_worker, tmp_path):
    count = 30_000 if FULL else 6_000
    mock = start_mock(tmp_path)
    try:
        env = {**FAULT_ENV, **GUARANTEE_ENV, "DLQ_INFERENCE_URL": mock.api_url}
        first = make_worker(env_extra=env).start()
        others = [make_worker(app_id=first.app_id, prefix=first.prefix, env_extra=env).start() for _ in range(2)]
        workers = [first, *others]
        wait_until(
            lambda: all(w.get("/")[1]["ready"] and w.get("/")[1]["assigned_partitions"] for w in workers),
            120,
            "three workers sharing the partitions",
        )
        ids = produce_ids(first, count, "three")
        wait_until(lambda: mock_calls(mock) >= count // 3, 300, "a third of the run")
        victim = workers[1]
        victim.kill()
        survivors = [w for w in workers if w is not victim]
        ledger = settled_ledger(first, ids, timeout=600)
        summary = {**ledger.summary(mock.url), "workers": 3, "killed": 1}
        report("three workers, one killed", summary)
        assert_guarantee(ledger, summary, GUARANTEE_ENV)
        expected_dead = set(ledger.dead)
        exact = GUARANTEE_ENV["DLQ_PROCESSING_GUARANTEE"] == "exactly_once"
        for worker in survivors:
            page = wait_until(
                page_listing(worker, "/dlq/?limit=1000", expected_dead, exact_total=exact),
                120,
                lambda worker=worker: (
                    f"the full DLQ on {worker.name} ({len(expected_dead)} dead letters), it shows "
                    f"{summarize_page(worker.get('/dlq/?limit=1000')[1], expected_dead)}"
                ),
            )
            assert "incomplete" not in page
            # at_least_once: a kill -9 may lose (or repeat) the counts of the dead letters recorded
            # in the victim's last count interval (dlqapp/tables/counters.py); the listing is exact
            assert abs(page["total"] - len(expected_dead)) <= (0 if exact else AT_LEAST_ONCE_COUNT_SLACK), page["total"]
    finally:
        mock.stop()
