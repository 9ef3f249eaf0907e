"""Retries under the default delays, across kill -9, at volume, and under an input flood."""

from __future__ import annotations

import json
from itertools import pairwise

from tests.kafka_io import (
    keys_seen,
    produce,
    read_topic,
    request_bytes,
)
from tests.support import unique, wait_until


def simulate(fail_times, error="server_error", **extra):
    return {"metadata": {"simulate": {"fail_times": fail_times, "error": error, **extra}}}


def never_early(history):
    return all(a["at"] >= a["scheduled"] for a in history if a["scheduled"] is not None)


def test_default_delays_four_failures_reach_the_dlq_never_early(make_worker):
    worker = make_worker().start()  # DLQ_RETRY_DELAYS left at its default: 1s,10s,1m
    rid = unique("default-tiers")
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid, **simulate(4, "timeout")))])
    (dead,) = [
        r
        for r in read_topic(worker.bootstrap, worker.topic("dlq"), lambda r: rid in keys_seen(r), 150)
        if r.key.decode() == rid
    ]
    assert dead.headers["retry_count"] == "3" and dead.headers["final_error"]
    history = json.loads(dead.headers["attempt_history"])
    assert len(history) == 4 and never_early(history)
    gaps = [b["scheduled"] - (a["at"] + a["duration_ms"]) for a, b in pairwise(history)]
    assert [g >= d for g, d in zip(gaps, (1000, 10_000, 60_000), strict=True)] == [True, True, True], gaps
    assert [a["topic"] for a in history][1:] == [worker.topic(t) for t in ("retry-1s", "retry-10s", "retry-1m")]


def test_parked_retries_survive_kill_9_and_fire_none_early(make_worker):
    worker = make_worker(env_extra={"DLQ_RETRY_DELAYS": "15s,16s,17s", "DLQ_SIMULATED_SUCCESS_RATE": "1.0"}).start()
    ids = [unique(f"parked{i}") for i in range(100)]
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid, **simulate(1))) for rid in ids])
    wait_until(lambda: worker.get("/retries/?limit=1")[1]["total"] == 100, 60, "100 parked retries")
    worker.kill()
    worker.start()
    records = read_topic(worker.bootstrap, worker.topic("results"), lambda r: set(ids) <= keys_seen(r), 120)
    by_id = {r.key.decode(): r.json for r in records}
    assert set(by_id) == set(ids)
    assert all(body["attempts"] == 2 and never_early(body["history"]) for body in by_id.values())
    assert len(records) == 100  # one result each: none lost, none doubled


def test_a_thousand_requests_at_the_default_success_rate_each_end_in_results_or_dlq(make_worker):
    worker = make_worker(env_extra={"DLQ_RETRY_DELAYS": "200ms,400ms,600ms", "DLQ_SIMULATED_SEED": "7"}).start()
    ids = [unique(f"bulk{i}") for i in range(1000)]
    produce(worker.bootstrap, worker.topic("input"), [(None, request_bytes(rid)) for rid in ids])
    wanted = set(ids)
    topics = [worker.topic("results"), worker.topic("dlq")]
    records = read_topic(worker.bootstrap, topics, lambda r: wanted <= keys_seen(r), 180)
    results = {r.key.decode() for r in records if r.topic == topics[0]} & wanted
    dead = {r.key.decode() for r in records if r.topic == topics[1]} & wanted
    assert results | dead == wanted
    assert not results & dead, "a request must have exactly one final outcome"
    assert 0.75 < len(results) / len(wanted) < 1.0


def test_due_retries_are_not_starved_by_an_input_flood(make_worker):
    worker = make_worker(
        env_extra={
            "DLQ_RETRY_DELAYS": "3s,4s,5s",
            "DLQ_SIMULATED_SUCCESS_RATE": "1.0",
            "DLQ_SIMULATED_LATENCY": "20ms",
            "DLQ_SIMULATED_JITTER": "0ms",
            "DLQ_CONCURRENCY": "4",
        }
    ).start()
    probe = unique("probe")
    produce(worker.bootstrap, worker.topic("input"), [(probe.encode(), request_bytes(probe, **simulate(1)))])
    wait_until(lambda: worker.get("/retries/?limit=1")[1]["total"] == 1, 30, "the probe to be parked")
    flood = [unique(f"flood{i}") for i in range(5000)]
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid)) for rid in flood])
    records = read_topic(worker.bootstrap, worker.topic("results"), lambda r: probe in keys_seen(r), 120)
    probe_retry = next(r.json for r in records if r.key.decode() == probe)["history"][1]
    all_results = read_topic(worker.bootstrap, worker.topic("results"), lambda r: len(r) >= 5001, 300)
    finished_before = sum(
        1 for r in all_results if r.key.decode() != probe and r.json["completed_at"] < probe_retry["at"]
    )
    assert probe_retry["at"] >= probe_retry["scheduled"]
    assert finished_before < len(flood) // 2, f"the due retry waited behind {finished_before} fresh requests"
