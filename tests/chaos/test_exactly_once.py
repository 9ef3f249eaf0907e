"""DLQ_PROCESSING_GUARANTEE=exactly_once: a read_committed consumer of `results` and `dlq`
sees exactly one outcome per request id (one result or one dead letter, never both, never
twice) through kill -9, a zombie worker and a rebalance; Kafka's own console consumer, with
`--isolation-level read_committed`, agrees.

Reduced sizes run in `make test`; `make chaos` (CHAOS_FULL=1) runs the full ones.
"""

from __future__ import annotations

import os
import random
import re
import signal
from collections import Counter
from datetime import datetime

import pytest

from tests.chaos.latency_support import safe_get
from tests.chaos.ledger import FULL, Ledger, assert_guarantee, settled_ledger
from tests.chaos.test_faults import calls_reached, mock_calls, produce_ids, report
from tests.kafka_io import produce, read_until_quiet, request_bytes
from tests.kafka_tools import committed_keys, transaction_states
from tests.support import MockLLM, http_json, wait_until

pytestmark = pytest.mark.timeout(3600 if FULL else 900)

READ_COMMITTED = {"isolation_level": "read_committed"}
EOS_ENV = {
    "DLQ_PROCESSING_GUARANTEE": "exactly_once",
    "DLQ_INFERENCE": "openai",
    "DLQ_INFERENCE_TIMEOUT": "2s",
    "DLQ_RETRY_DELAYS": "200ms,400ms,600ms",
    "DLQ_SESSION_TIMEOUT": "6s",
}


def assert_kafkas_consumer_agrees(worker, ids: list[str]) -> None:
    """Kafka's own console consumer, reading committed records only, sees one outcome per id too."""
    seen = committed_keys(worker.bootstrap, [worker.topic("results"), worker.topic("dlq")], len(ids))
    assert sorted(seen) == sorted(ids), (
        f"{len(set(ids) - set(seen))} ids without an outcome, {len(set(seen) - set(ids))} unknown"
    )
    assert [rid for rid, n in seen.items() if n != 1] == [], "ids with more than one committed outcome"


def flaky_mock(tmp_path) -> MockLLM:
    """A provider that fails a fifth of the requests once and a twentieth always: every
    request ends in a result or, after its retries, a dead letter."""
    return MockLLM(
        tmp_path,
        args=[
            "--latency-ms",
            "10",
            "--jitter-ms",
            "5",
            "--fail-once",
            "503=0.2",
            "--fail-always",
            "503=0.05",
            "--seed",
            "7",
        ],
    ).start()


def test_each_request_has_one_committed_outcome(make_worker, tmp_path):
    mock = flaky_mock(tmp_path)
    try:
        worker = make_worker(env_extra={**EOS_ENV, "DLQ_INFERENCE_URL": mock.api_url}).start()
        ids = produce_ids(worker, 400, "eos")
        ledger = settled_ledger(worker, ids)
        summary = ledger.summary(mock.url)
        report("exactly_once, no faults", summary)
        assert_guarantee(ledger, summary, EOS_ENV)
        assert summary["dead_letters"] > 0 and summary["results"] > 0  # both kinds of outcome were made
        assert summary["extra_calls"] == 0, summary  # without a fault, no call is made twice
    finally:
        mock.stop()


def test_kill_9_during_load_and_retries_leaves_one_outcome_per_request(make_worker, tmp_path):
    count, kills = (100_000, 5) if FULL else (2_000, 2)
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "517")))
    mock = flaky_mock(tmp_path)
    try:
        worker = make_worker(env_extra={**EOS_ENV, "DLQ_INFERENCE_URL": mock.api_url}).start()
        ids = produce_ids(worker, count, "eos-kill")
        for kill in range(kills):
            target = int(count * (kill + 1) / (kills + 1) * rng.uniform(0.8, 1.1))
            wait_until(calls_reached(mock, target), 300, f"{target} backend calls before kill {kill + 1}")
            worker.kill()
            worker.start()
        ledger = settled_ledger(worker, ids, timeout=1800 if FULL else 600)
        summary = {**ledger.summary(mock.url), "kills": kills}
        report("exactly_once, worker kill -9", summary)
        assert_guarantee(ledger, summary, EOS_ENV)
        assert_kafkas_consumer_agrees(worker, ids)
        window = (
            64 * 4 * 2
        )  # steps in flight (2 x concurrency per agent, input and due) and those waiting for their commit
        assert summary["extra_calls"] <= kills * window, summary
    finally:
        mock.stop()


def test_a_zombie_worker_writes_nothing_visible_and_a_third_worker_joining_changes_nothing(make_worker, tmp_path):
    """A worker frozen (SIGSTOP) past its session timeout loses its partitions; when it wakes
    up (SIGCONT) its producers are fenced, so nothing it still sends becomes visible. A
    third worker joining mid-run moves partitions again."""
    count = 20_000 if FULL else 1_000
    mock = MockLLM(
        tmp_path, args=["--latency-ms", "200", "--jitter-ms", "50", "--fail-once", "503=0.2", "--seed", "9"]
    ).start()
    try:
        env = {**EOS_ENV, "DLQ_INFERENCE_URL": mock.api_url}
        first = make_worker(env_extra=env, name="w1").start()
        second = make_worker(env_extra=env, app_id=first.app_id, prefix=first.prefix, name="w2").start()
        ids = produce_ids(first, count, "eos-zombie")
        wait_until(lambda: mock_calls(mock) >= count // 4, 300, "a quarter of the calls before the freeze")
        first.process.send_signal(signal.SIGSTOP)
        try:
            # the group gives the frozen worker's partitions to the other one
            wait_until(
                lambda: second.get("/")[1].get("assignment", {}).get(first.topic("input")) == [0, 1, 2],
                120,
                "the other worker to own every partition",
                interval=0.5,
            )
        finally:
            first.process.send_signal(signal.SIGCONT)
        third = make_worker(env_extra=env, app_id=first.app_id, prefix=first.prefix, name="w3").start()
        ledger = settled_ledger(third, ids)
        # fenced, the woken worker restarted in place (same process) and serves again
        wait_until(
            lambda: first.process.poll() is None and safe_get(first, "/").get("ready"),
            180,
            lambda: (
                f"the woken worker back and ready; its log ends:\n{first.log_tail(40)}\n"
                f"its process:\n{first.process_state()}"
            ),
        )
        summary = {**ledger.summary(mock.url), "zombie": True, "joined": 1}
        report("exactly_once, zombie and a join", summary)
        assert_guarantee(ledger, summary, EOS_ENV)
        assert_kafkas_consumer_agrees(third, ids)
    finally:
        mock.stop()


def _log_time_ms(worker, pattern: str) -> float | None:
    """When the worker's log first says `pattern` (its lines start with a local timestamp)."""
    match = re.search(rf"^\[([0-9-]+ [0-9:]+,[0-9]+)\] \[\d+\] \[\w+\] {pattern}", worker.log_path.read_text(), re.M)
    return None if match is None else datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000


def test_a_worker_whose_transaction_failed_calls_the_model_no_more_until_it_restarts(make_worker, tmp_path):
    """A transaction that cannot commit restarts the worker after a grace period. Every call
    made meanwhile is for an output that can never commit, and is made again after the
    restart: paid twice. Measured before the fix (a broker frozen 20 s, 6,000 requests, the
    mock at 10 ms): 627 calls in the 10 s before the restart, 4,859 in another run. Frozen
    past DLQ_TRANSACTION_TIMEOUT, the broker aborts the worker's transaction; awake, the
    worker fails its commit and must call for none but the steps already running."""
    concurrency = 16
    mock = MockLLM(tmp_path, args=["--latency-ms", "10", "--jitter-ms", "5", "--log-calls"]).start()
    try:
        env = {
            **EOS_ENV,
            "DLQ_INFERENCE_URL": mock.api_url,
            "DLQ_CONCURRENCY": str(concurrency),
            "DLQ_ADAPTIVE_CONCURRENCY": "false",
            "DLQ_TRANSACTION_TIMEOUT": "3s",
            "DLQ_SESSION_TIMEOUT": "45s",
        }
        worker = make_worker(env_extra=env).start()
        ids = produce_ids(worker, 3_000, "eos-halt")
        wait_until(calls_reached(mock, 300), 300, "300 calls before the freeze")
        freeze_until_the_broker_aborts(worker, mock)
        wait_until(lambda: _log_time_ms(worker, "restart_exec") is not None, 120, "the restart after the freeze")
        ledger = settled_ledger(worker, ids)
        failed, restarted = _log_time_ms(worker, "restarting the worker"), _log_time_ms(worker, "restart_exec")
        calls = http_json(mock.url + "/_mock/call-log")[1]["calls"]
        between = [c for c in calls if failed <= c["at_ms"] <= restarted]
        summary = {**ledger.summary(mock.url), "calls_while_restarting": len(between)}
        report("exactly_once, a failed transaction", summary)
        assert_guarantee(ledger, summary, EOS_ENV)
        # the steps running when it failed (one window per agent that calls: input, tiers)
        assert len(between) <= 2 * concurrency, summary
    finally:
        mock.stop()


def freeze_until_the_broker_aborts(worker, mock: MockLLM, tries: int = 5) -> None:
    """SIGSTOP `worker` while a transaction of its is open at the broker, and SIGCONT it once
    the broker aborted that transaction (past its timeout, at the broker's next check, every
    10 s). A freeze that finds none open (the worker between two transactions, or none of its
    records sent yet) is undone and tried again after more calls."""

    def open_ones() -> set[str]:
        states = transaction_states(worker.bootstrap)
        return {tid for tid, state in states.items() if tid.startswith(f"{worker.app_id}-") and state == "Ongoing"}

    for _ in range(tries):
        worker.process.send_signal(signal.SIGSTOP)
        try:
            ongoing = open_ones()
            if ongoing:
                wait_until(
                    lambda frozen=ongoing: not frozen & open_ones(), 60, f"the broker aborting {sorted(ongoing)}"
                )
                return
        finally:
            worker.process.send_signal(signal.SIGCONT)
        wait_until(calls_reached(mock, mock_calls(mock) + 100), 120, "100 more calls")
    pytest.fail(f"{tries} freezes found no transaction of the worker open at the broker")


def test_a_replay_starts_a_new_chain_with_one_outcome_of_its_own_through_a_kill(make_worker, tmp_path):
    """What a read_committed consumer reads for a replayed request: the dead letter of chain 0,
    then its tombstone on `dlq` (committed with the replay), then exactly one outcome of chain
    1, whose records carry `replay_count: 1`. Half the replays are asked just before a kill -9."""
    mock = MockLLM(tmp_path, args=["--latency-ms", "10"]).start()
    try:
        worker = make_worker(env_extra={**EOS_ENV, "DLQ_INFERENCE_URL": mock.api_url}).start()
        ids = [f"replay-{i}-{worker.app_id[-6:]}" for i in range(20)]
        for rid in ids:
            mock.plan(request_id=rid, fail_times=1, status=401)  # auth_error: dead-lettered at the first attempt
        produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid)) for rid in ids])
        Ledger.read(
            worker.bootstrap, worker.topic("results"), worker.topic("dlq"), ids, timeout=120, client=READ_COMMITTED
        )
        wait_until(lambda: worker.get("/dlq/")[1].get("total") == len(ids), 60, "every dead letter listed")
        for rid in ids[:10]:
            assert worker.get(f"/dlq/{rid}/")[0] == 200
            status, body = http_json(f"{worker.url}/dlq/{rid}/reprocess/", "POST")
            assert status == 200 and body["status"] == "reprocessed", body
        worker.kill()
        worker.start()
        for rid in ids[10:]:
            status, body = http_json(f"{worker.url}/dlq/{rid}/reprocess/", "POST")
            assert status == 200 and body["status"] == "reprocessed", body
        records = read_until_quiet(
            worker.bootstrap, [worker.topic("results"), worker.topic("dlq")], 3, READ_COMMITTED, quiet_s=3.0
        )
        chains = Counter(
            (r.key.decode(), r.headers.get("replay_count", "0"), r.topic.rsplit(".", 1)[-1]) for r in records if r.value
        )
        tombstones = Counter(r.key.decode() for r in records if r.value is None and r.topic == worker.topic("dlq"))
        for rid in ids:
            assert chains[(rid, "0", "dlq")] == 1 and chains[(rid, "0", "results")] == 0, (rid, chains)
            assert chains[(rid, "1", "results")] + chains[(rid, "1", "dlq")] == 1, (rid, chains)
            assert tombstones[rid] == 1, rid
    finally:
        mock.stop()
