"""The tail read (DLQ_TAIL_READ_LAG): a tenant's requests written behind another tenant's
flood are read at the end of `input` and start ahead of their turn, and none is lost or
answered twice on the way, through a kill -9 too.

The worker reads ahead little (DLQ_READ_AHEAD=100) and calls slowly, so its door stays far
behind the flood for seconds: without the tail read, B's requests would start only after
almost all of A's. Reduced sizes run in `make test`; `make chaos` (CHAOS_FULL=1) the full ones.
"""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.chaos.ledger import FULL, assert_guarantee, settled_ledger
from tests.chaos.test_exactly_once import READ_COMMITTED, assert_kafkas_consumer_agrees
from tests.kafka_io import produce, read_until_quiet, request_bytes
from tests.support import MockLLM, Worker, unique, wait_until

pytestmark = pytest.mark.timeout(1800 if FULL else 600)

FLOOD = 6_000 if FULL else 3_000
B_REQUESTS = 40 if FULL else 20
ENV = {
    "DLQ_INFERENCE": "openai",
    "DLQ_TAIL_READ_LAG": "200",
    "DLQ_READ_AHEAD": "100",
    "DLQ_CONCURRENCY": "8",
    "DLQ_ADAPTIVE_CONCURRENCY": "false",
    "DLQ_SESSION_TIMEOUT": "6s",
}


def _tenant_requests(worker: Worker, tenant: str, count: int) -> list[str]:
    ids = [f"{tenant}-{i}-{unique('t')[-6:]}" for i in range(count)]
    for start in range(0, count, 5000):
        chunk = ids[start : start + 5000]
        records = [(rid.encode(), request_bytes(rid, metadata={"tenant": tenant})) for rid in chunk]
        produce(worker.bootstrap, worker.topic("input"), records)
    return ids


def _metric(worker: Worker, name: str, **labels: str) -> float:
    """The sum of the samples of `name` (of those with `labels`, when given)."""
    with urllib.request.urlopen(worker.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    families = text_string_to_metric_families(text)
    return sum(
        sample.value
        for family in families
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def _flood_then_b(make_worker, mock: MockLLM, guarantee: str) -> tuple[Worker, list[str], list[str]]:
    """A worker under A's flood, its tail read started, then B's requests written behind it."""
    env = {**ENV, "DLQ_INFERENCE_URL": mock.api_url, "DLQ_PROCESSING_GUARANTEE": guarantee}
    worker = make_worker(env_extra=env).start()
    a_ids = _tenant_requests(worker, "a", FLOOD)

    def tail_read_lines() -> str:
        return "\n".join(
            line for line in worker.log_path.read_text(errors="replace").splitlines() if "tail_read" in line
        )

    wait_until(
        lambda: _metric(worker, "dlqapp_tail_read_partitions") == 3,  # DLQ_PARTITIONS of the tests
        120,
        lambda: (
            f"the tail read of every partition behind A's flood (reading "
            f"{_metric(worker, 'dlqapp_tail_read_partitions'):g}; the worker's tail read lines:\n{tail_read_lines()})"
        ),
    )
    assert " tail_read_started " in worker.log_path.read_text(errors="replace")
    b_ids = _tenant_requests(worker, "b", B_REQUESTS)
    return worker, a_ids, b_ids


@pytest.mark.parametrize("guarantee", ["exactly_once", "at_least_once"])
def test_a_tenant_written_behind_a_flood_starts_ahead_of_its_turn_and_nothing_is_lost(make_worker, tmp_path, guarantee):
    mock = MockLLM(tmp_path, args=["--latency-ms", "20"]).start()
    try:
        worker, a_ids, b_ids = _flood_then_b(make_worker, mock, guarantee)
        env = {"DLQ_PROCESSING_GUARANTEE": guarantee}
        ledger = settled_ledger(worker, a_ids + b_ids)
        assert_guarantee(ledger, ledger.summary(mock.url), env)
        # every B request; a few of A's may start ahead too, read at the end while A's flood was
        # still being written and A had few waiting (the same work, in another order)
        assert _metric(worker, "dlqapp_started_ahead_of_turn_total", tenant="b") == len(b_ids)
        results = read_until_quiet(worker.bootstrap, [worker.topic("results")], 3, READ_COMMITTED, quiet_s=2.0)
        when = {r.key.decode(): r.timestamp for r in results if r.key}
        b_done = max(when[rid] for rid in b_ids)
        a_before = sum(1 for rid in a_ids if when[rid] <= b_done)
        # B's requests were written after all of A's: read in turn, they would have started
        # only after about FLOOD - DLQ_READ_AHEAD of A's
        assert a_before < len(a_ids) // 2, f"{a_before} of A's {len(a_ids)} results came before B's last"
    finally:
        mock.stop()


def test_a_kill_while_requests_run_ahead_of_their_turn_loses_none_and_answers_none_twice(make_worker, tmp_path):
    mock = MockLLM(tmp_path, args=["--latency-ms", "20"]).start()
    try:
        worker, a_ids, b_ids = _flood_then_b(make_worker, mock, "exactly_once")
        some_b = set(b_ids[: len(b_ids) // 4])

        def some_b_answered() -> bool:
            records = read_until_quiet(worker.bootstrap, [worker.topic("results")], 3, READ_COMMITTED, quiet_s=0.2)
            return len(some_b & {r.key.decode() for r in records if r.key}) >= 2

        wait_until(some_b_answered, 120, "B's first results")
        worker.kill()
        worker.start()
        ledger = settled_ledger(worker, a_ids + b_ids)
        assert_guarantee(ledger, ledger.summary(mock.url), {"DLQ_PROCESSING_GUARANTEE": "exactly_once"})
        assert_kafkas_consumer_agrees(worker, a_ids + b_ids)
    finally:
        mock.stop()
