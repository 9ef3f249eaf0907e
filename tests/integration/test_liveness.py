"""Liveness: every request reaches `results` or the DLQ, whatever the backend answers,
and a worker stops on Ctrl-C or SIGTERM even while its circuit breaker holds requests.

Tiers and breaker pauses are scaled down (1s,2s,3s; pauses up to 8 s) so the bound the
issue names, the sum of the tier delays plus 2 × DLQ_BREAKER_MAX_OPEN, is 22 s here.
Waits use three times that bound: a livelock (the old breaker) never finishes at all.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from functools import partial
from typing import Any

import pytest

from tests.kafka_io import (
    keys_seen,
    produce,
    read_topic,
    request_bytes,
)
from tests.support import (
    FAUST,
    MockLLM,
    unique_ids,
    wait_until,
)

FAST = {
    "DLQ_BREAKER": "true",
    "DLQ_RETRY_DELAYS": "1s,2s,3s",
    "DLQ_BREAKER_OPEN": "2s",
    "DLQ_BREAKER_MAX_OPEN": "8s",
}
BOUND_S = 1 + 2 + 3 + 2 * 8
WAIT_S = 3 * BOUND_S + 30


def always_failing(rid: str, error: str = "server_error") -> bytes:
    return request_bytes(rid, metadata={"simulate": {"fail_times": 99, "error": error}})


def outcomes(worker, ids: list[str], timeout: float) -> dict[str, str]:
    """request id → the topic (results or dlq) of its first outcome."""
    wanted = set(ids)
    results, dlq = worker.topic("results"), worker.topic("dlq")
    records = read_topic(worker.bootstrap, [results, dlq], lambda r: wanted <= keys_seen(r), timeout)
    found: dict[str, str] = {}
    for record in records:
        key = record.key.decode()
        if key in wanted and record.value is not None:
            found.setdefault(key, "results" if record.topic == results else "dlq")
    return found


def test_a_failing_tail_alone_still_reaches_the_dlq(make_worker):
    """Issue 12 case 1: 20 always-5xx requests and 10 good ones, then nothing else."""
    worker = make_worker(env_extra={**FAST, "DLQ_SIMULATED_SUCCESS_RATE": "1.0"}).start()
    bad, good = unique_ids("tail-bad", 20), unique_ids("tail-ok", 10)
    produce(
        worker.bootstrap,
        worker.topic("input"),
        [(r.encode(), always_failing(r)) for r in bad] + [(r.encode(), request_bytes(r)) for r in good],
    )
    found = outcomes(worker, bad + good, WAIT_S)
    assert {r: found[r] for r in good} == {r: "results" for r in good}
    assert {r: found[r] for r in bad} == {r: "dlq" for r in bad}

    def dlq_entry(rid: str) -> Any:
        status, body = worker.get(f"/dlq/{rid}/")
        return body if status == 200 else None

    for rid in bad[:3]:  # the DLQ agent records an entry a moment after the dead letter is on the topic
        entry = wait_until(partial(dlq_entry, rid), 30, f"the DLQ entry of {rid}")
        assert entry["error_class"] == "server_error" and entry["attempts"] == 4


def test_the_readme_demo_finishes_with_the_breaker_on(make_worker):
    """Issue 12 case 0: `generate --count 300 --rate 100 --fail-share 0.1` on the default simulated backend."""
    worker = make_worker(env_extra=FAST).start()
    env = {**worker.env(), "DLQ_WEB_URL": worker.url}
    run = subprocess.run(
        [str(FAUST), "-A", "dlqapp", "generate", "--count", "300", "--rate", "100", "--fail-share", "0.1", "--json"],
        env=env,
        cwd=worker.tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    prefix = json.loads(run.stdout)["prefix"]
    ids = [f"{prefix}-{n}" for n in range(300)]
    found = outcomes(worker, ids, WAIT_S)
    assert len(found) == 300
    assert worker.process.poll() is None


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_worker_stops_promptly_while_the_breaker_holds_requests_and_loses_none(make_worker, tmp_path, sig):
    """A held request has made no attempt: the stop hands it back at once, not after the
    running steps' grace period (DLQ_DRAIN_TIMEOUT, long here so that waiting it out fails)."""
    mock = MockLLM(tmp_path, args=["--latency-ms", "5"]).start()
    try:
        env = {
            **FAST,
            "DLQ_INFERENCE": "openai",
            "DLQ_INFERENCE_URL": mock.api_url,
            "DLQ_INFERENCE_TIMEOUT": "2s",
            "DLQ_BREAKER_OPEN": "60s",
            "DLQ_BREAKER_MAX_OPEN": "60s",
            "DLQ_DRAIN_TIMEOUT": "90s",
        }
        worker = make_worker(env_extra=env).start()
        mock.outage(True)
        ids = unique_ids("held", 60)
        produce(worker.bootstrap, worker.topic("input"), [(r.encode(), request_bytes(r)) for r in ids])
        breaker = lambda: next(iter(worker.get("/dlq/stats/")[1]["breaker"].values()))  # noqa: E731
        wait_until(
            lambda: breaker()["state"] == "open" and breaker()["waiting"] > 0, 60, "the breaker to hold requests"
        )
        started = time.monotonic()
        worker.process.send_signal(sig)
        worker.process.wait(timeout=30)  # raises if the worker hangs
        assert time.monotonic() - started < 30
        mock.outage(False)
        successor = make_worker(app_id=worker.app_id, prefix=worker.prefix, env_extra=env, name="successor").start()
        found = outcomes(successor, ids, 120)
        assert set(found) == set(ids)
        assert "dlq" not in found.values()  # the outage cost no attempts
    finally:
        mock.stop()


def test_after_an_outage_healthy_requests_complete_and_always_failing_ones_reach_the_dlq(make_worker, tmp_path):
    mock = MockLLM(tmp_path, args=["--latency-ms", "5"]).start()
    try:
        env = {**FAST, "DLQ_INFERENCE": "openai", "DLQ_INFERENCE_URL": mock.api_url, "DLQ_INFERENCE_TIMEOUT": "2s"}
        worker = make_worker(env_extra=env).start()
        broken = unique_ids("broken", 3)
        for rid in broken:
            mock.plan(request_id=rid, fail_times=99, status=500)
        first = unique_ids("before", 50)
        produce(worker.bootstrap, worker.topic("input"), [(r.encode(), request_bytes(r)) for r in broken + first])
        wait_until(
            lambda: worker.get(f"/requests/{broken[0]}/")[1].get("state") == "retry_scheduled",
            30,
            "a broken request in the retry chain",
        )
        mock.outage(True)
        during = unique_ids("during", 100)
        for n in range(0, 100, 10):  # steady input through the outage
            produce(
                worker.bootstrap, worker.topic("input"), [(r.encode(), request_bytes(r)) for r in during[n : n + 10]]
            )
            time.sleep(1)
        mock.outage(False)
        found = outcomes(worker, broken + first + during, WAIT_S)
        assert {r: found[r] for r in broken} == {r: "dlq" for r in broken}
        healthy = first + during
        assert {r: found[r] for r in healthy} == {r: "results" for r in healthy}
    finally:
        mock.stop()


def test_a_worker_asked_to_stop_while_its_group_rebalances_stops_cleanly_and_loses_none(make_worker, tmp_path):
    """A rolling restart: the old worker is asked to stop (SIGTERM) while its calls hang,
    and a new one joins the group meanwhile, so a rebalance reaches the stopping worker.
    Faust then closes the Kafka consumer; it must do so on the consumer's own event loop
    (under uvloop the wrong one crashed the process with SIGSEGV). The old worker exits 0
    within DLQ_DRAIN_TIMEOUT + 5 s, and the new one finishes every request, once."""
    mock = MockLLM(tmp_path, args=["--latency-ms", "5"]).start()
    try:
        env = {
            "DLQ_INFERENCE": "openai",
            "DLQ_INFERENCE_URL": mock.api_url,
            "DLQ_INFERENCE_TIMEOUT": "120s",
            "DLQ_DRAIN_TIMEOUT": "10s",
            "DLQ_ADAPTIVE_CONCURRENCY": "false",  # every call in flight at once (adaptive: a few, growing)
        }
        old = make_worker(env_extra=env, name="old").start()
        ids = unique_ids("rolling", 30)
        for rid in ids:
            mock.plan(request_id=rid, fail_times=1, status="timeout")  # the old worker's calls hang
        produce(old.bootstrap, old.topic("input"), [(r.encode(), request_bytes(r)) for r in ids])
        wait_until(lambda: mock.stats()["calls"] >= len(ids), 60, "every request's call in flight")
        new = make_worker(app_id=old.app_id, prefix=old.prefix, env_extra=env, name="new").start(wait=False)
        wait_until(lambda: "topics_ready" in new.log_tail(200), 120, "the new worker about to join the group")
        asked = time.monotonic()
        old.process.send_signal(signal.SIGTERM)
        code = old.process.wait(timeout=10 + 5 + 10)
        took = time.monotonic() - asked
        log = old.log_tail(400)
        assert "consumer_closing" in log, f"no rebalance reached the stopping worker:\n{log}"
        assert code == 0 and "Fatal Python error" not in log, f"exited {code} after {took:.1f} s:\n{log}"
        assert took < 10 + 5, f"the stop took {took:.1f} s"
        new.wait_ready()
        found = outcomes(new, ids, 120)
        assert set(found) == set(ids) and set(found.values()) == {"results"}, found
    finally:
        mock.stop()
