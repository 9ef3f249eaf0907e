"""`stats_cost`: what `GET /dlq/stats/` and `GET /metrics` cost a worker whose `requests`
table holds many settled request states."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from typing import Any

from bench.drivers import requests_for
from bench.harness import Worker, produce, unique_ids, wait_until
from bench.measure import percentile, process_memory, spread
from bench.systems import Bench

STATS_COST_LARGE = int(os.environ.get("BENCH_STATS_COST_REQUESTS", "1000000"))
"""Request states in the large `stats_cost` run (1M by default; seeding and restoring them take a few minutes)."""
CALLS = 200
"""Calls timed per endpoint in each run."""


def seed_request_states(bootstrap: str, changelog: str, count: int) -> list[str]:
    """Write `count` succeeded request states to a `requests` changelog; returns their ids."""
    from dlqapp.core import states

    ids = unique_ids("seed", count)
    at = int(time.time() * 1000)
    for i in range(0, count, 50_000):
        chunk = ids[i : i + 50_000]
        values = [states.transition(None, rid, states.SUCCEEDED, at, attempts=1).encode() for rid in chunk]
        produce(bootstrap, changelog, [(rid.encode(), value) for rid, value in zip(chunk, values, strict=True)])
    return ids


def _seeded_worker(bench: Bench, size: int) -> tuple[Worker, list[str]]:
    """A worker (stopped) whose `requests` changelog holds `size` succeeded states."""
    worker = bench.simulated_worker(latency_ms=1)
    worker.start()  # creates the topics; the states then go in through the changelog
    worker.kill()
    return worker, seed_request_states(bench.bootstrap, f"{worker.app_id}-requests-changelog", size)


def _time_calls(url: str) -> list[float]:
    """Milliseconds of each of CALLS GETs of `url`."""
    times = []
    for _ in range(CALLS):
        began = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as response:
            response.read()
        times.append((time.perf_counter() - began) * 1000)
    return times


def _stats_cost_once(bench: Bench, worker: Worker, known_ids: list[str]) -> dict[str, float]:
    """Start `worker`, prove its states are there, time the reads, stop it."""
    started = time.monotonic()
    worker.start(wait=False)
    try:
        worker.wait_ready(timeout=3600)  # the first start restores every state from the changelog
        start_s = time.monotonic() - started
        stats = lambda: worker.get("/dlq/stats/")[1]  # noqa: E731
        skipped_before = stats().get("duplicates_skipped", 0)
        produce(bench.bootstrap, worker.topic("input"), requests_for(known_ids))  # succeeded already: skipped
        wait_until(
            lambda: stats().get("duplicates_skipped", 0) >= skipped_before + len(known_ids),
            300,
            "the seeded ids skipped as duplicates",
        )
        row: dict[str, float] = {"start_s": round(start_s, 1)}
        for name, path in (("stats", "/dlq/stats/"), ("metrics", "/metrics")):
            times = _time_calls(worker.url + path)
            row[f"{name}_p50_ms"] = round(percentile(times, 0.5), 2)
            row[f"{name}_p99_ms"] = round(percentile(times, 0.99), 2)
        row["rss_mib"] = round(process_memory(worker.process.pid)["rss_bytes"] / 2**20)
        return row
    finally:
        worker.kill()


def stats_cost(bench: Bench) -> dict[str, Any]:
    """`GET /dlq/stats/` and `GET /metrics` latency (p50/p99 of 200 calls each) and RSS of
    a worker whose `requests` table holds N settled request states, beside one holding
    1k. The states are written to each worker's changelog once; each of 3 runs (1 with
    --quick) restarts both workers, which then hold the states in RocksDB."""
    sizes = (200, 1_000) if bench.quick else (1_000, STATS_COST_LARGE)
    runs = 1 if bench.quick else 3
    workers = {size: _seeded_worker(bench, size) for size in sizes}
    samples: dict[int, list[dict[str, float]]] = {size: [] for size in sizes}
    for run in range(runs):
        for size, (worker, seeded) in workers.items():
            samples[size].append(_stats_cost_once(bench, worker, seeded[run * 20 : (run + 1) * 20]))
            print(f"  stats cost run {run + 1} at {size:,}: {json.dumps(samples[size][-1])}", flush=True)
    out: dict[str, Any] = {}
    for size, rows in samples.items():
        out[str(size)] = {
            "requests": size,
            "runs": rows,
            **{name: spread([row[name] for row in rows]) for name in rows[0]},
        }
    small, large = (samples[n] for n in sizes)
    out["p99_ratio_large_to_small"] = spread(
        [b["stats_p99_ms"] / a["stats_p99_ms"] for a, b in zip(small, large, strict=True)]
    )
    return out
