"""Fair shares between tenants: tenant B's latency at a steady 10 requests/s, alone and while
tenant A floods the input with 20,000 requests at once, and the whole throughput of A's flood
with and without B (the mock at LATENCY_MS; 3 runs, median and range); B under the flood with
the tail read (the default) and without it (DLQ_TAIL_READ_LAG=0), side by side.

Written to bench/results/fairness.json and fairness.md (whatever --out says: a run of this
section alone must not replace the full report's latest.*)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from bench.drivers import produce_in_batches, produce_paced, wait_results
from bench.harness import Record, read_topic, unique_ids
from bench.measure import percentile, spread
from bench.systems import CONCURRENCY, LATENCY_MS, Bench

RESULTS = Path(__file__).resolve().parent.parent / "results"
B_RATE = 10
B_SECONDS = 20
FAIR_RUNS = int(os.environ.get("BENCH_FAIR_RUNS") or 3)
FAIR_ONLY = tuple(c for c in os.environ.get("BENCH_FAIR_CONFIGS", "").split(",") if c)
"""While investigating: only these configurations (default all)."""


def _body(rid: str, tenant: str) -> bytes:
    doc = {
        "request_id": rid,
        "model": "bench-model",
        "messages": [{"role": "user", "content": f"ticket {rid}: where is my order?"}],
        "metadata": {"tenant": tenant},
    }
    return json.dumps(doc).encode()


def _latencies(bench: Bench, input_topic: str, results: list[Record], ids: list[str]) -> list[float]:
    """End to end (produce → result) in ms of `ids`, from the records' own timestamps."""
    wanted = set(ids)
    inputs = {
        r.key.decode(): r.timestamp
        for r in read_topic(bench.bootstrap, input_topic, lambda rs: wanted <= {x.key.decode() for x in rs}, 120)
        if r.key and r.key.decode() in wanted
    }
    return [r.timestamp - inputs[r.key.decode()] for r in results if r.key and r.key.decode() in wanted]


def _one(bench: Bench, flood: int, with_b: bool, env: dict[str, str]) -> dict[str, Any]:
    """One worker: A's flood (if any) at once and B at 10/s (if `with_b`); B's latency and the throughput."""
    worker = bench.dlqapp_worker(bench.mock, DLQ_PRICES='{"*": {"input": 0.15, "output": 0.6}}', **env)
    worker.start()
    try:
        a_ids = unique_ids("fa", flood)
        b_ids = unique_ids("fb", B_RATE * B_SECONDS) if with_b else []
        input_topic = worker.topic("input")
        started = time.time()
        if flood:
            produce_in_batches(bench.bootstrap, input_topic, [(rid.encode(), _body(rid, "A")) for rid in a_ids])
        paced = threading.Thread(
            target=produce_paced,
            args=(bench.bootstrap, input_topic, [(rid.encode(), _body(rid, "B")) for rid in b_ids], B_RATE),
        )
        paced.start()
        paced.join()
        results = wait_results(bench.bootstrap, worker.topic("results"), a_ids + b_ids, timeout=1800)
        out: dict[str, Any] = {}
        if b_ids:
            b = _latencies(bench, input_topic, results, b_ids)
            out["b_p50_ms"], out["b_p99_ms"] = percentile(b, 0.5), percentile(b, 0.99)
        if flood:
            a_done = max(r.timestamp for r in results if r.key and r.key.decode() in set(a_ids)) / 1000
            out["flood_requests_per_s"] = flood / max(0.001, a_done - started)
            out["all_requests_per_s"] = len(results) / max(0.001, max(r.timestamp for r in results) / 1000 - started)
        return out
    finally:
        worker.kill()


def fairness(bench: Bench) -> dict[str, Any]:
    runs = 1 if bench.quick else FAIR_RUNS
    flood = 500 if bench.quick else 20_000
    configs: dict[str, tuple[int, bool, dict[str, str]]] = {
        "b_alone": (0, True, {}),
        "a_flood_alone": (flood, False, {}),
        "a_flood_with_b": (flood, True, {}),
        "a_flood_with_b_no_tail_read": (flood, True, {"DLQ_TAIL_READ_LAG": "0"}),
    }
    configs = {name: config for name, config in configs.items() if not FAIR_ONLY or name in FAIR_ONLY}
    per_run: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for run in range(runs):
        for name, (size, with_b, env) in configs.items():
            per_run[name].append(_one(bench, size, with_b, env))
            print(f"  fairness run {run + 1} {name}: {per_run[name][-1]}", flush=True)
    out: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": f"bench/run.py --only fairness{' --quick' if bench.quick else ''} --out <scratch dir>",
        "mock_latency_ms": LATENCY_MS,
        "concurrency": CONCURRENCY,
        "flood": flood,
        "b_rate_per_s": B_RATE,
        "b_seconds": B_SECONDS,
        "runs": runs,
    }
    for name, results in per_run.items():
        figures = {key: spread([r[key] for r in results]) for key in results[0]}
        out[name] = {**figures, "per_run": results}
    if FAIR_ONLY:
        return out
    alone, flooded = out["b_alone"]["b_p99_ms"]["median"], out["a_flood_with_b"]["b_p99_ms"]["median"]
    out["b_p99_ratio"] = flooded / alone if alone else None
    without = out["a_flood_with_b_no_tail_read"]["b_p99_ms"]["median"]
    out["b_p99_ratio_no_tail_read"] = without / alone if alone else None
    out["throughput_ratio"] = (
        out["a_flood_with_b"]["flood_requests_per_s"]["median"] / out["a_flood_alone"]["flood_requests_per_s"]["median"]
    )
    if not bench.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "fairness.json").write_text(json.dumps(out, indent=2) + "\n")
        (RESULTS / "fairness.md").write_text(markdown(out))
    return out


def markdown(out: dict[str, Any]) -> str:
    def cell(figure: dict[str, float] | None, unit: str) -> str:
        if not figure:
            return "–"
        return f"{figure['median']:.0f} {unit} ({figure['min']:.0f}–{figure['max']:.0f})"

    rows = [
        f"| {name} | {cell(out[name].get('b_p50_ms'), 'ms')} | {cell(out[name].get('b_p99_ms'), 'ms')} | "
        f"{cell(out[name].get('flood_requests_per_s'), 'req/s')} |"
        for name in ("b_alone", "a_flood_alone", "a_flood_with_b", "a_flood_with_b_no_tail_read")
    ]
    return "\n".join(
        [
            "# Fair shares between tenants",
            "",
            f"{out['when']}; `{out['command']}`; mock latency {out['mock_latency_ms']} ms, "
            f"concurrency {out['concurrency']}; tenant B at {out['b_rate_per_s']}/s for {out['b_seconds']} s, "
            f"tenant A's flood {out['flood']:,} requests at once; {out['runs']} runs, median (min–max).",
            "",
            "| run | B p50 | B p99 | A's flood throughput |",
            "|---|---|---|---|",
            *rows,
            "",
            "`a_flood_with_b`: the default settings (the tail read on: DLQ_TAIL_READ_LAG=200); "
            "`a_flood_with_b_no_tail_read`: DLQ_TAIL_READ_LAG=0.",
            "",
            f"B's p99 with the flood / alone: {out['b_p99_ratio']:.1f}x "
            f"({out['b_p99_ratio_no_tail_read']:.1f}x without the tail read); "
            f"flood throughput with B / without: {out['throughput_ratio']:.2f}.",
            "",
        ]
    )
