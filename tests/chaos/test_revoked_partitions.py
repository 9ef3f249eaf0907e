"""A fault under rebalances, ending with the ledger check (B; A, under broker latency, is
tests/chaos/test_latency_faults.py).

B. A worker whose partitions are revoked stops writing for them: during a provider
   outage (breaker on) two workers hold full in-flight windows, a third joins (the
   partitions move while requests are held), the outage lasts on, then recovery and a
   kill -9. Nothing is lost, and backend calls beyond the recorded attempts stay within
   the in-flight windows the faults can orphan.

`make test` runs B reduced; `make chaos` (CHAOS_FULL=1) runs it at full size. When ids go
missing, the failure names them, where they were last seen (every topic and changelog),
the group's committed offsets, and where each worker's asyncio tasks wait (mode's SIGUSR1
dump, in the worker's log).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.chaos.latency_support import (
    breaker,
    breaker_state,
    calls_by_id,
    held_during_outage,
    log_lines,
    mock_calls,
    produce_ids,
    read_ledger,
    safe_get,
)
from tests.chaos.ledger import FULL
from tests.chaos.test_faults import report
from tests.support import MockLLM, unique, wait_until

# -- B ----------------------------------------------------------------------------------------


@pytest.mark.timeout(1800 if FULL else 600)
def test_a_worker_whose_partitions_are_revoked_stops_writing_for_them(make_worker, tmp_path: Path):
    count = 10_000 if FULL else 2_000
    outage_s = 120 if FULL else 20
    concurrency = 8
    rebalances, kills = 1, 1
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "808")))
    mock = MockLLM(tmp_path, args=["--latency-ms", "50", "--jitter-ms", "10", "--seed", "17"]).start()
    env = {
        "DLQ_INFERENCE": "openai",
        "DLQ_INFERENCE_URL": mock.api_url,
        "DLQ_INFERENCE_TIMEOUT": "2s",
        "DLQ_RETRY_DELAYS": "200ms,400ms,600ms",
        "DLQ_SESSION_TIMEOUT": "6s",
        "DLQ_CONCURRENCY": str(concurrency),
        "DLQ_BREAKER": "true",
        "DLQ_BREAKER_OPEN": "2s",
        "DLQ_BREAKER_MAX_OPEN": "8s",
    }
    started = time.monotonic()
    try:
        first = make_worker(env_extra=env, name="w1").start()
        second = make_worker(app_id=first.app_id, prefix=first.prefix, env_extra=env, name="w2").start()
        pair = [first, second]
        wait_until(lambda: all(safe_get(w, "/").get("ready") for w in pair), 120, "two workers sharing the partitions")

        mock.outage(True)
        ids = [f"rev-{i}-{unique('x')[-6:]}" for i in range(count)]
        produce_ids(first.bootstrap, first.topic("input"), ids)
        # Full windows: every worker's breaker open and 2 x DLQ_CONCURRENCY requests held.
        wait_until(
            lambda: all(
                breaker_state(w) in ("open", "half_open") and safe_get(w, "/").get("in_flight", 0) >= 2 * concurrency
                for w in pair
            ),
            120,
            "both breakers open with full in-flight windows",
        )
        held_before_join = {w.name: safe_get(w, "/").get("in_flight") for w in pair}

        third = make_worker(app_id=first.app_id, prefix=first.prefix, env_extra=env, name="w3").start()
        workers = [*pair, third]
        joined = time.monotonic()
        wait_until(
            lambda: all(safe_get(w, "/").get("ready") and safe_get(w, "/").get("assigned_partitions") for w in workers),
            120,
            "three workers sharing the partitions",
        )
        time.sleep(max(0.0, outage_s - (time.monotonic() - joined)))
        calls_at_recovery = mock_calls(mock)
        mock.outage(False)

        # Breakers close by themselves once the backend answers; a breaker that stays open
        # or half-open holds the requests of its partitions for good. Then every hold is
        # counted (nothing is held after).
        try:
            wait_until(
                lambda: all(breaker_state(w) == "closed" for w in workers), 120, "every breaker closed after the outage"
            )
        except AssertionError as exc:
            snapshots = {
                w.name: {k: breaker(w).get(k) for k in ("state", "waiting", "moves", "transitions")} for w in workers
            }
            evidence = log_lines(workers, r"breaker_|in_flight_released|Revoking|Worker ready", 40)
            raise AssertionError(f"{exc}: {json.dumps(snapshots)}\n" + "\n".join(evidence)) from None
        held = {w.name: held_during_outage(w) for w in workers}
        wait_until(
            lambda: mock_calls(mock) >= calls_at_recovery + count // 4, 300, "a quarter of the run after recovery"
        )
        victim = rng.choice(workers)
        victim.kill()

        ledger = read_ledger(workers, mock, ids, timeout=600 if FULL else 240)
        calls = calls_by_id(mock, ids)
        per_id_extra = Counter(calls[rid] - ledger.attempts.get(rid, 0) for rid in ids)
        extra = ledger.extra_calls(mock.url)
        bound = len(workers) * concurrency * (rebalances + kills)
        summary = {
            **ledger.summary(mock.url),
            "workers": 3,
            "concurrency": concurrency,
            "rebalances": rebalances,
            "kills": kills,
            "outage_s": outage_s,
            "held_by_breaker": sum(held.values()),
            "extra_calls_not_held": extra - sum(held.values()),
            "extra_calls_bound": bound,
            "seconds": round(time.monotonic() - started),
        }
        report("outage, rebalance and kill -9 with full in-flight windows", summary)
        print("in flight before the join:", held_before_join, "held by breaker:", held, "victim:", victim.name)
        print("ids by extra calls:", dict(sorted(per_id_extra.items())))
        assert ledger.lost == [], f"{len(ledger.lost)} lost, e.g. {ledger.lost[:5]}; {summary}"
        assert ledger.mixed == [], f"ids with both a result and a dead letter: {ledger.mixed[:5]}"
        # A call the breaker held is by design not an attempt; every other extra call is one
        # a fault orphaned: at most the calls in flight on each worker, per fault.
        assert extra - sum(held.values()) <= bound, summary
        # Per request: at most one held call per handling, one orphaned call per fault.
        per_id_bound = 1 + 2 * (rebalances + kills)
        over = {
            rid: calls[rid] - ledger.attempts.get(rid, 0)
            for rid in ids
            if calls[rid] - ledger.attempts.get(rid, 0) > per_id_bound
        }
        assert not over, f"ids called more often than their attempts allow: {dict(list(over.items())[:10])}"
        # Once the windows are released nothing of the revoked assignment runs, so Faust's
        # wait for acks ends at once; it warns after 10 s of waiting (a handler running for a
        # partition the group may have given to another worker: see InFlightWindow.release).
        stuck = log_lines(workers, r"wait_empty: Waiting for tasks", 5)
        assert not stuck, "a revocation waited for handlers of the revoked assignment:\n" + "\n".join(
            line[:300] for line in stuck
        )
    finally:
        mock.stop()
