"""1. Throughput and latency: baselines A and B beside dlqapp (0% and 10% failures) with
the shared mocks at LATENCY_MS; end-to-end p50/p99 under a paced load."""

from __future__ import annotations

import statistics
import subprocess
from collections.abc import Callable
from typing import Any

from bench.drivers import make_topics, produce_paced, requests_for, wait_results
from bench.harness import Record, read_topic, unique, unique_ids
from bench.measure import percentile, throughput_of
from bench.systems import CONCURRENCY, Bench, baseline_command


def throughput(bench: Bench) -> dict[str, Any]:
    """Requests/s (median of runs) of each system, and the ratios dlqapp/A and dlqapp/B."""
    runs = 1 if bench.quick else 3
    n_sync = 6 if bench.quick else 60
    n_fast = 200 if bench.quick else 6000
    systems: dict[str, Callable[[], list[Record]]] = {
        "baseline_a_sync": lambda: bench.run_baseline("baseline_sync.py", n_sync),
        "baseline_b_aiokafka": lambda: bench.run_baseline(
            "baseline_async.py", n_fast, ["--concurrency", str(CONCURRENCY)]
        ),
        "dlqapp_0pct_failures": lambda: bench.run_dlqapp(n_fast, bench.mock),
        "dlqapp_10pct_failures": lambda: bench.run_dlqapp(n_fast, bench.mock_failing),
    }
    out: dict[str, Any] = {}
    for name, run in systems.items():
        rates = []
        for _ in range(runs):
            rates.append(throughput_of(run()))
            print(f"  {name}: {rates[-1]:.1f} req/s", flush=True)
        out[name] = {"requests_per_s": statistics.median(rates), "runs": rates}
    dlqapp = out["dlqapp_0pct_failures"]["requests_per_s"]
    out["ratio_dlqapp_to_a"] = dlqapp / out["baseline_a_sync"]["requests_per_s"]
    out["ratio_dlqapp_to_b"] = dlqapp / out["baseline_b_aiokafka"]["requests_per_s"]
    out["ratio_dlqapp_10pct_to_b"] = (
        out["dlqapp_10pct_failures"]["requests_per_s"] / out["baseline_b_aiokafka"]["requests_per_s"]
    )
    return out


def _start_paced(bench: Bench, name: str, count: int) -> tuple[str, str, Callable[[], None]]:
    """Baseline B (`count` requests to come) or a dlqapp worker: input and results topics, and how to stop it."""
    if name == "dlqapp_0pct_failures":
        worker = bench.dlqapp_worker(bench.mock)
        worker.start()
        return worker.topic("input"), worker.topic("results"), worker.kill
    prefix = unique("lat") + "."
    settings = make_topics(bench.bootstrap, prefix)
    args = baseline_command(
        "baseline_async.py",
        bench.bootstrap,
        settings,
        bench.mock,
        prefix + "g",
        count,
        "--concurrency",
        str(CONCURRENCY),
    )
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return settings.input, settings.results, process.kill


def paced_latency(bench: Bench) -> dict[str, Any]:
    """End-to-end p50/p99 at a steady rate well below capacity (produce → result)."""
    rate, seconds = (50, 2) if bench.quick else (200, 15)
    count = rate * seconds
    out = {}
    for name in ("baseline_b_aiokafka", "dlqapp_0pct_failures"):
        input_topic, results_topic, stop = _start_paced(bench, name, count)
        try:
            ids = unique_ids("p", count)
            produce_paced(bench.bootstrap, input_topic, requests_for(ids), rate)
            results = wait_results(bench.bootstrap, results_topic, ids, timeout=300)
            inputs = {
                r.key.decode(): r.timestamp
                for r in read_topic(bench.bootstrap, input_topic, lambda rs: len(rs) >= count, 60)
            }
            e2e = [r.timestamp - inputs[r.key.decode()] for r in results]
            out[name] = {"rate_per_s": rate, "e2e_p50_ms": percentile(e2e, 0.5), "e2e_p99_ms": percentile(e2e, 0.99)}
            print(
                f"  {name} at {rate}/s: p50 {out[name]['e2e_p50_ms']} ms, p99 {out[name]['e2e_p99_ms']} ms", flush=True
            )
        finally:
            stop()
    return out
