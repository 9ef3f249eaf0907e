"""4. and 5.: recovery after kill -9 with many parked retries, and flow control against a
provider that limits requests per minute."""

from __future__ import annotations

import json
import time
from typing import Any

from bench.drivers import (
    parked_gauge,
    produce_in_batches,
    requests_with_plan,
    wait_results,
)
from bench.harness import (
    MockLLM,
    produce,
    request_bytes,
    unique,
    unique_ids,
    wait_until,
)
from bench.systems import Bench

FLOW_LATENCY_MS = 1000
"""Backend latency in the flow-control section (an LLM's, not the mock's 100 ms default)."""
FLOW_MODEL = "bench-model"
"""The model every flow-control request names (DLQ_RATE_LIMITS limits it)."""


def _flow_setups(rpm: int) -> dict[str, dict[str, str]]:
    """No flow control, adaptive concurrency alone, and DLQ_RATE_LIMITS at the provider's limit."""
    return {
        "none": {"DLQ_ADAPTIVE_CONCURRENCY": "false"},
        "adaptive_concurrency": {"DLQ_ADAPTIVE_CONCURRENCY": "true"},
        "rate_limits": {"DLQ_ADAPTIVE_CONCURRENCY": "true", "DLQ_RATE_LIMITS": f"{FLOW_MODEL}={rpm}rpm"},
    }


def _flow_once(bench: Bench, rpm: int, count: int, env: dict[str, str]) -> dict[str, Any]:
    """`count` requests at once to a fresh worker with `env`, against a fresh mock limited to `rpm`."""
    mock = MockLLM(
        bench.tmp,
        args=[
            "--latency-ms",
            str(FLOW_LATENCY_MS),
            "--jitter-ms",
            str(FLOW_LATENCY_MS // 5),
            "--limit-rpm",
            str(rpm),
            "--seed",
            "3",
        ],
    ).start()
    worker = bench.dlqapp_worker(mock, DLQ_RETRY_DELAYS="1s,10s,1m", **env)
    try:
        worker.start()
        ids = unique_ids("fc", count)
        started = time.monotonic()
        produce(
            bench.bootstrap,
            worker.topic("input"),
            [(rid.encode(), request_bytes(rid, model=FLOW_MODEL)) for rid in ids],
        )
        outcomes = wait_results(bench.bootstrap, [worker.topic("results"), worker.topic("dlq")], ids, timeout=3600)
        elapsed = time.monotonic() - started
        stats = mock.stats()
        succeeded = [r for r in outcomes if r.topic == worker.topic("results")]
        return {
            "calls": stats["calls"],
            "429s": stats["throttled"],
            "429_share": stats["throttled"] / stats["calls"],
            "attempts_per_request": stats["calls"] / count,
            "succeeded": len(succeeded),
            "dead_lettered": count - len(succeeded),
            "completion_s": round(elapsed, 1),
            "outcomes_per_min": round(count / elapsed * 60, 1),
        }
    finally:
        worker.kill()
        mock.stop()


def flow_control(bench: Bench) -> dict[str, Any]:
    """The same load against a provider limited to `rpm` (dlqapp-mock-llm --limit-rpm, 1 s
    latency): with no flow control (a fixed DLQ_CONCURRENCY, as before), with adaptive
    concurrency alone, and with DLQ_RATE_LIMITS at the provider's limit. 429s the provider
    sent, attempts per request, dead letters, time until every request has an outcome."""
    rpm, count = (3000, 150) if bench.quick else (600, 2000)
    out: dict[str, Any] = {"provider_rpm": rpm, "requests": count, "latency_ms": FLOW_LATENCY_MS}
    for name, env in _flow_setups(rpm).items():
        out[name] = _flow_once(bench, rpm, count, env)
        print(f"  flow control {name}: {json.dumps(out[name])}", flush=True)
    return out


def recovery(bench: Bench) -> dict[str, Any]:
    """kill -9 a worker holding many parked retries: time until it is ready, and until it
    processes a fresh request again; how many parked retries it still holds."""
    parked = 200 if bench.quick else 100_000
    worker = bench.simulated_worker(latency_ms=1, DLQ_RETRY_DELAYS="30m,31m,32m", DLQ_SESSION_TIMEOUT="6s")
    worker.start()
    try:
        ids = unique_ids("park", parked)
        loading = time.monotonic()
        produce_in_batches(
            bench.bootstrap, worker.topic("input"), requests_with_plan(ids, fail_times=1, error="server_error")
        )
        wait_until(lambda: parked_gauge(worker) >= parked, 1800, f"{parked} parked retries", interval=1.0)
        load_s = time.monotonic() - loading
        worker.kill()
        killed = time.monotonic()
        worker.start(wait=False)
        worker.wait_ready(timeout=900)
        ready_s = time.monotonic() - killed
        probe = unique("after-recovery")
        produce(bench.bootstrap, worker.topic("input"), [(probe.encode(), request_bytes(probe))])
        wait_results(bench.bootstrap, worker.topic("results"), [probe], timeout=300)
        processing_s = time.monotonic() - killed
        survived = worker.get("/retries/?limit=1")[1]["total"]
        out = {
            "parked": parked,
            "load_s": round(load_s, 1),
            "kill_to_ready_s": round(ready_s, 1),
            "kill_to_processing_s": round(processing_s, 1),
            "parked_after_restart": survived,
        }
        print(f"  recovery: {out}", flush=True)
        return out
    finally:
        worker.kill()
