"""2. Retry lateness per tier (attempt start − scheduled_time): probes paced or all at
once, each alone or while a flood of fresh input drains; in the default mode
(exactly_once) and in the other beside it, in turn within every run."""

from __future__ import annotations

import json
import os
from typing import Any

from bench.drivers import (
    BENCH_PARTITIONS,
    LoopLagSampler,
    produce_in_batches,
    produce_paced,
    requests_for,
    requests_with_plan,
    wait_results,
)
from bench.harness import Worker, produce, unique_ids, wait_until
from bench.measure import load_average, percentile, spread
from bench.systems import BENCH_GUARANTEE, LATENCY_MS, OTHER_GUARANTEE, Bench

PROBES_PER_S = 50
"""Probe requests for retry lateness arrive at this rate, except in the burst and flood scenarios."""
LATENESS_RUNS = int(os.environ.get("BENCH_LATENESS_RUNS", "5"))
"""Runs of each lateness scenario (fresh worker each)."""
LATENESS_SCENARIOS = ("idle", "paced_under_flood", "burst", "under_flood")
"""Probes paced or all at once (a burst), each alone or while a flood of fresh input drains."""
LATENESS_ONLY = tuple(s for s in os.environ.get("BENCH_LATENESS_SCENARIOS", "").split(",") if s)
"""While investigating: only these scenarios (default all)."""
LATENESS_MODES = tuple(m for m in os.environ.get("BENCH_LATENESS_MODES", "").split(",") if m) or (
    BENCH_GUARANTEE,
    OTHER_GUARANTEE,
)
"""The processing guarantees measured, the default first (each run measures each in turn)."""


def probe_lateness(
    bootstrap: str,
    worker: Worker,
    probes: int,
    flood_size: int = 0,
    per_second: int | None = None,
    partitions: int = BENCH_PARTITIONS,
) -> dict[str, list[float]]:
    """Lateness (attempt start − scheduled_time, ms) per tier of `probes` requests that fail
    three times (a retryable error of their own, not an outage): all at once (their retries
    fall due together), or `per_second`; optionally while `flood_size` fresh requests arrive."""
    ids = unique_ids("probe", probes)
    # a request's own retryable failure: a burst of 5xx would look like an outage and open the
    # circuit breaker, which holds retries by design (README, Circuit breaker)
    requests = requests_with_plan(ids, fail_times=3, error="unknown")
    if per_second:
        if flood_size:  # the flood first: paced probes then fail, wait and retry while it drains
            produce_in_batches(bootstrap, worker.topic("input"), requests_for(unique_ids("flood", flood_size)), 5000)
        produce_paced(bootstrap, worker.topic("input"), requests, per_second)
    else:
        produce(bootstrap, worker.topic("input"), requests)
        if flood_size:
            wait_until(lambda: worker.get("/retries/?limit=1")[1]["total"] >= probes * 0.9, 120, "probes parked")
            produce_in_batches(bootstrap, worker.topic("input"), requests_for(unique_ids("flood", flood_size)), 5000)
    per_tier: dict[str, list[float]] = {}
    for record in wait_results(bootstrap, worker.topic("results"), ids, timeout=600, partitions=partitions):
        for attempt in record.json["history"][1:]:
            per_tier.setdefault(attempt["topic"].split(".")[-1], []).append(attempt["at"] - attempt["scheduled"])
    return per_tier


def lateness_summary(per_tier: dict[str, list[float]]) -> dict[str, dict[str, float | None]]:
    """Per tier: count, p50, p99, max and min of the lateness samples."""
    return {
        tier: {
            "n": len(v),
            "p50_ms": percentile(v, 0.5),
            "p99_ms": percentile(v, 0.99),
            "max_ms": max(v),
            "min_ms": min(v),
        }
        for tier, v in sorted(per_tier.items())
    }


def _lateness_run(
    bench: Bench, probes: int, flood_size: int, per_second: int | None, mode: str
) -> tuple[dict[str, Any], list[float]]:
    """One run on a fresh worker in `mode`: its per-tier summary and worst loop lag, and every sample."""
    worker = bench.simulated_worker(latency_ms=LATENCY_MS, DLQ_PROCESSING_GUARANTEE=mode)
    worker.start()
    try:
        with LoopLagSampler(worker) as lag:
            per_tier = probe_lateness(bench.bootstrap, worker, probes, flood_size, per_second)
        row = {"per_tier": lateness_summary(per_tier), "loop_lag_max_ms": lag.max_ms, "load_average": load_average()}
        return row, [x for v in per_tier.values() for x in v]
    finally:
        worker.kill()


def _over_runs(per_run: list[dict[str, Any]]) -> dict[str, Any]:
    """Per tier, the runs together: all samples counted, p50 and p99 as median and range, the worst."""
    return {
        tier: {
            "n": sum(r["per_tier"][tier]["n"] for r in per_run),
            "p50_ms": spread([r["per_tier"][tier]["p50_ms"] for r in per_run]),
            "p99_ms": spread([r["per_tier"][tier]["p99_ms"] for r in per_run]),
            "max_ms": max(r["per_tier"][tier]["max_ms"] for r in per_run),
        }
        for tier in per_run[0]["per_tier"]
    }


def lateness(bench: Bench) -> dict[str, Any]:
    """Retry lateness per tier: `idle` (probes paced, nothing else to do),
    `paced_under_flood` (the same probes while a flood of fresh input drains), `burst` (all
    probes at once, so their retries fall due together and queue for backend slots) and
    `under_flood` (a burst, then a flood while the retries wait). Each scenario runs 5 times (once with
    --quick) on a fresh worker per run and mode, the modes in turn; each run's p99 per tier and the worst
    event-loop lag the worker reported during it are kept, and summarised as min / median / max.
    The default mode's figures are at the top level, the other mode's under its name."""
    probes = 10 if bench.quick else 300
    flood = 300 if bench.quick else 20_000
    runs = 1 if bench.quick else LATENESS_RUNS
    modes = LATENESS_MODES[:1] if bench.quick else LATENESS_MODES  # --quick: the harness, not the comparison
    scenarios = tuple(
        (label, flood_size, per_second)
        for label, flood_size, per_second in zip(
            LATENESS_SCENARIOS, (0, flood, 0, flood), (PROBES_PER_S, PROBES_PER_S, None, None), strict=True
        )
        if not LATENESS_ONLY or label in LATENESS_ONLY
    )
    by_mode: dict[str, dict[str, Any]] = {mode: {} for mode in modes}
    for label, flood_size, per_second in scenarios:
        per_run: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
        samples: dict[str, list[float]] = {mode: [] for mode in modes}
        for run in range(runs):
            for mode in modes:
                row, run_samples = _lateness_run(bench, probes, flood_size, per_second, mode)
                per_run[mode].append(row)
                samples[mode] += run_samples
                worst = max(t["p99_ms"] for t in row["per_tier"].values())
                print(
                    f"  lateness {label} {mode} run {run + 1}: worst tier p99 {worst} ms {json.dumps(row)}", flush=True
                )
        for mode in modes:
            _summarise(by_mode[mode], label, per_run[mode], samples[mode])
    for figures in by_mode.values():
        _ratios(figures)
    out = by_mode[modes[0]]
    out["guarantee"] = modes[0]
    for mode in modes[1:]:
        out[mode] = {**by_mode[mode], "guarantee": mode}
    return out


def _summarise(out: dict[str, Any], label: str, per_run: list[dict[str, Any]], samples: list[float]) -> None:
    """One scenario's runs of one mode into `out`."""
    out[label] = _over_runs(per_run)
    out[label + "_loop_lag_max_ms"] = spread([r["loop_lag_max_ms"] for r in per_run])
    out[label + "_worst_tier_p99_ms"] = spread([max(t["p99_ms"] for t in r["per_tier"].values()) for r in per_run])
    out[label + "_runs"] = per_run
    out[label + "_samples"] = sorted(samples)


def _ratios(out: dict[str, Any]) -> None:
    """The worst-tier p99 medians of the loaded scenarios over the idle (or burst) one, when measured."""

    def worst(label: str) -> float | None:
        figure = out.get(label + "_worst_tier_p99_ms")
        return None if figure is None else max(1.0, figure["median"])

    for key, loaded, base in (
        ("flood_to_idle_worst_tier_p99", "under_flood", "idle"),
        ("paced_flood_to_idle_worst_tier_p99", "paced_under_flood", "idle"),
        ("flood_to_burst_worst_tier_p99", "under_flood", "burst"),
        ("burst_to_idle_worst_tier_p99", "burst", "idle"),
    ):
        a, b = worst(loaded), worst(base)
        if a is not None and b is not None:
            out[key] = a / b
