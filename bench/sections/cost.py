"""Per-request cost beside baseline B, each system measured in turn in every run:
`overhead` (the mock answers at once: what the pipeline itself costs) and `llm_scale`
(real model latency, 1,024 in flight), with resident memory under many calls in flight.

dlqapp runs in the default mode (`dlqapp_0pct_failures`, exactly_once) and in the other
beside it (`dlqapp_0pct_failures_at_least_once`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.drivers import SystemDied, produce_in_batches, requests_for, wait_results
from bench.harness import MockLLM, unique_ids, wait_until
from bench.measure import cpu_seconds, load_average, process_memory, spread, throughput_of
from bench.profiling import Profiler
from bench.systems import BENCH_BEFORE, BENCH_GUARANTEE, CONCURRENCY, OTHER_GUARANTEE, Bench, Running

LLM_LATENCY_MS, LLM_JITTER_MS = 2000, 500
LLM_CONCURRENCY = 1024
"""`llm_scale`: model latency people see, and the in-flight count it takes to reach 512/s."""
RSS_IN_FLIGHT = 4096
RSS_HOLD_MS = 600_000
"""Mock latency while resident memory is measured: the calls stay in flight meanwhile."""

OTHER_MODE = f"dlqapp_0pct_failures_{OTHER_GUARANTEE}"
"""dlqapp at 0 % failures in the mode beside the default one."""

C_OWN_HTTP = "baseline_c_faust_dlqapp_http"
"""Baseline C calling the model with dlqapp's HTTP client instead of aiohttp's (`llm_scale`)."""

BEFORE = "dlqapp_before"
"""dlqapp at 0 % failures from the BENCH_BEFORE tree, in the default mode."""

Lineup = dict[str, tuple[Callable[[], Running], MockLLM]]
"""Per system: how to start it, and the mock it calls (whose CPU is counted too)."""


# -- measuring -------------------------------------------------------------------------


def ratios(section: dict[str, Any], system: str, base: str, figure: str = "requests_per_s") -> dict[str, Any]:
    """`system` / `base` in `figure` (requests/s by default): of the medians, and per run
    (each run measured both in turn)."""
    per_run = [a[figure] / b[figure] for a, b in zip(section[system]["runs"], section[base]["runs"], strict=True)]
    return {"of_medians": section[system][figure]["median"] / section[base][figure]["median"], "per_run": per_run}


def cost_run(
    bench: Bench,
    start: Callable[[], Running],
    mock: MockLLM,
    count: int,
    profile: str | None = None,
    before_stop: Callable[[], dict[str, float]] | None = None,
) -> dict[str, float]:
    """Start a system, hand it `count` requests at once, wait for every outcome: its
    requests/s, and the CPU seconds per 1,000 requests it and the mock used meanwhile.
    With `profile` (and --profile), py-spy records the system meanwhile (see `Profiler`).
    `before_stop` runs once the figures are taken, the system still running; what it
    returns joins them."""
    system = start()
    profiler = Profiler(bench.profile_dir, profile, system.pid) if bench.profile_dir and profile else None
    try:
        ids = unique_ids("c", count)
        assert mock.process is not None
        cpu, mock_cpu = cpu_seconds(system.pid), cpu_seconds(mock.process.pid)
        produce_in_batches(bench.bootstrap, system.input, requests_for(ids))
        try:
            outcomes = wait_results(bench.bootstrap, system.results, ids, timeout=1800, alive=system.alive)
        except SystemDied as exc:
            raise SystemDied(f"{exc} (its log: {system.log})") from None
        cpu, mock_cpu = cpu_seconds(system.pid) - cpu, cpu_seconds(mock.process.pid) - mock_cpu
        extra = before_stop() if before_stop is not None else {}
    finally:
        if profiler is not None:
            profiler.stop()
        system.stop()
    results = [r for r in outcomes if r.topic == system.results[0]]
    return {
        "requests_per_s": throughput_of(results),
        "cpu_s_per_1k": cpu * 1000 / count,
        "mock_cpu_s_per_1k": mock_cpu * 1000 / count,
        "dead_lettered": len(outcomes) - len(results),
        **extra,
        "load_average": load_average(),
    }


def cost_run_repeated(
    bench: Bench,
    start: Callable[[], Running],
    mock: MockLLM,
    count: int,
    profile: str | None = None,
    attempts: int = 2,
    before_stop: Callable[[], dict[str, float]] | None = None,
) -> dict[str, float]:
    """`cost_run`, once more should the process die (reported, never hidden: `repeated`)."""
    for attempt in range(1, attempts + 1):
        try:
            return {**cost_run(bench, start, mock, count, profile, before_stop), "repeated": attempt - 1}
        except SystemDied as exc:
            print(f"  ! {exc}; attempt {attempt} of {attempts}", flush=True)
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


def side_by_side(bench: Bench, section: str, systems: Lineup, count: int, runs: int) -> dict[str, Any]:
    """`runs` rounds, each measuring every system once in turn (so the machine's load
    falls alike on all); per system the runs, and the median and range of each figure.
    With --profile, the first run of each system is recorded as `<section>-<system>`."""
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
    for run in range(runs):
        for name, (start, mock) in systems.items():
            rows[name].append(
                cost_run_repeated(bench, start, mock, count, profile=f"{section}-{name}" if run == 0 else None)
            )
            row = rows[name][-1]
            print(
                f"  run {run + 1} {name}: {row['requests_per_s']:.1f} req/s, {row['cpu_s_per_1k']:.2f} CPU s/1k "
                f"(mock {row['mock_cpu_s_per_1k']:.2f})",
                flush=True,
            )
    out: dict[str, Any] = {"requests": count}
    for name, measured in rows.items():
        out[name] = {
            "runs": measured,
            **{
                figure: spread([row[figure] for row in measured])
                for figure in ("requests_per_s", "cpu_s_per_1k", "mock_cpu_s_per_1k")
            },
        }
    return out


# -- the sections ----------------------------------------------------------------------


def other_mode(bench: Bench, start: Any, mock: MockLLM) -> dict[str, Any]:
    """dlqapp in the other guarantee, as a system beside the default one; none with --quick
    (the quick pass keeps the harness working, it compares nothing)."""
    return {} if bench.quick else {OTHER_MODE: (start, mock)}


def before(bench: Bench, mock: MockLLM, concurrency: int) -> dict[str, Any]:
    """The BENCH_BEFORE tree's worker as a system beside today's (none unless it is set)."""
    if not BENCH_BEFORE or bench.quick:
        return {}
    return {BEFORE: (lambda: bench.start_dlqapp(mock, concurrency, PYTHONPATH=BENCH_BEFORE), mock)}


def with_before(out: dict[str, Any]) -> dict[str, Any]:
    """Today's worker against the BENCH_BEFORE tree's: requests/s and CPU per request."""
    if BEFORE in out:
        out["before_tree"] = BENCH_BEFORE
        out["ratio_now_to_before"] = ratios(out, "dlqapp_0pct_failures", BEFORE)
        out["cpu_now_to_before"] = (
            out["dlqapp_0pct_failures"]["cpu_s_per_1k"]["median"] / out[BEFORE]["cpu_s_per_1k"]["median"]
        )
    return out


def overhead(bench: Bench) -> dict[str, Any]:
    """What the pipeline itself costs: the mock answers at once (0 ms), 64 calls in flight;
    dlqapp beside baseline B, and dlqapp again with 10% transient failures (503s)."""
    count, runs = (100, 1) if bench.quick else (20_000, 3)
    count, runs = bench.requests or count, bench.runs or runs
    mock = MockLLM(bench.tmp, args=["--latency-ms", "0"]).start()
    failing = MockLLM(bench.tmp, args=["--latency-ms", "0", "--fail", "503=0.1", "--seed", "5"]).start()
    try:
        out = side_by_side(
            bench,
            "overhead",
            {
                "baseline_b_aiokafka": (lambda: bench.start_baseline_b(mock, CONCURRENCY), mock),
                "baseline_c_faust": (lambda: bench.start_baseline_c(mock, CONCURRENCY), mock),
                "dlqapp_0pct_failures": (lambda: bench.start_dlqapp(mock, CONCURRENCY), mock),
                **other_mode(
                    bench, lambda: bench.start_dlqapp(mock, CONCURRENCY, DLQ_PROCESSING_GUARANTEE=OTHER_GUARANTEE), mock
                ),
                "dlqapp_10pct_failures": (lambda: bench.start_dlqapp(failing, CONCURRENCY), failing),
                **before(bench, mock, CONCURRENCY),
            },
            count,
            runs,
        )
    finally:
        mock.stop()
        failing.stop()
    out["concurrency"], out["latency_ms"] = CONCURRENCY, 0
    out["guarantee"], out["other_guarantee"] = BENCH_GUARANTEE, OTHER_GUARANTEE
    out["ratio_dlqapp_to_b"] = ratios(out, "dlqapp_0pct_failures", "baseline_b_aiokafka")
    out["ratio_dlqapp_to_c"] = ratios(out, "dlqapp_0pct_failures", "baseline_c_faust")
    if OTHER_MODE in out:
        out["ratio_other_mode_to_c"] = ratios(out, OTHER_MODE, "baseline_c_faust")
    out["ratio_c_to_b"] = ratios(out, "baseline_c_faust", "baseline_b_aiokafka")
    out["ratio_10pct_to_0pct"] = ratios(out, "dlqapp_10pct_failures", "dlqapp_0pct_failures")
    return with_before(out)


def llm_scale(bench: Bench) -> dict[str, Any]:
    """The source documents' load with real model latency: the mock answers in 2000 ± 500 ms,
    1024 calls in flight (ceiling 512/s); dlqapp beside baseline B and Faust's floor C, C
    with aiohttp's client and with dlqapp's own (`C_OWN_HTTP`: what a Faust app making the
    same calls pays at the least). Then resident memory with 4,096 calls in flight (`rss`)."""
    count, runs = (100, 1) if bench.quick else (12_000, 3)
    count, runs = bench.requests or count, bench.runs or runs
    mock = MockLLM(
        bench.tmp, args=["--latency-ms", str(LLM_LATENCY_MS), "--jitter-ms", str(LLM_JITTER_MS), "--seed", "5"]
    ).start()
    try:
        out = side_by_side(
            bench,
            "llm_scale",
            {
                "baseline_b_aiokafka": (lambda: bench.start_baseline_b(mock, LLM_CONCURRENCY), mock),
                "baseline_c_faust": (lambda: bench.start_baseline_c(mock, LLM_CONCURRENCY), mock),
                C_OWN_HTTP: (lambda: bench.start_baseline_c(mock, LLM_CONCURRENCY, http="dlqapp"), mock),
                "dlqapp_0pct_failures": (lambda: bench.start_dlqapp(mock, LLM_CONCURRENCY), mock),
                **other_mode(
                    bench,
                    lambda: bench.start_dlqapp(mock, LLM_CONCURRENCY, DLQ_PROCESSING_GUARANTEE=OTHER_GUARANTEE),
                    mock,
                ),
                **before(bench, mock, LLM_CONCURRENCY),
            },
            count,
            runs,
        )
    finally:
        mock.stop()
    ceiling = LLM_CONCURRENCY / (LLM_LATENCY_MS / 1000)
    out.update(concurrency=LLM_CONCURRENCY, latency_ms=LLM_LATENCY_MS, jitter_ms=LLM_JITTER_MS, ceiling_per_s=ceiling)
    out["guarantee"], out["other_guarantee"] = BENCH_GUARANTEE, OTHER_GUARANTEE
    out["ratio_dlqapp_to_b"] = ratios(out, "dlqapp_0pct_failures", "baseline_b_aiokafka")
    out["cpu_dlqapp_to_c"] = {
        name: ratios(out, "dlqapp_0pct_failures", name, "cpu_s_per_1k") for name in ("baseline_c_faust", C_OWN_HTTP)
    }
    out["ratio_dlqapp_to_ceiling"] = out["dlqapp_0pct_failures"]["requests_per_s"]["median"] / ceiling
    out["ratio_b_to_ceiling"] = out["baseline_b_aiokafka"]["requests_per_s"]["median"] / ceiling
    if not os.environ.get("BENCH_SKIP_RSS"):
        out["rss"] = rss_in_flight(bench, 64 if bench.quick else RSS_IN_FLIGHT)
    return with_before(out)


# -- resident memory with calls in flight ----------------------------------------------


def _rss_of(bench: Bench, name: str, system: Running, mock: MockLLM, in_flight: int) -> dict[str, float]:
    """Resident memory of a started `system` idle, then with `in_flight` calls held at `mock`; stops it."""
    try:
        idle = process_memory(system.pid)["rss_bytes"]
        calls = mock.stats()["calls"]
        produce_in_batches(bench.bootstrap, system.input, requests_for(unique_ids("rss", in_flight)))

        def all_in_flight() -> bool:
            if not system.alive():
                raise SystemDied(f"{name} exited (its log: {system.log})")
            return mock.stats()["calls"] - calls >= in_flight

        wait_until(all_in_flight, 600, f"{in_flight} calls in flight at the mock", interval=0.5)
        busy = process_memory(system.pid)["rss_bytes"]
    finally:
        system.stop()
    return {"idle_rss_mib": idle / 2**20, "rss_mib": busy / 2**20, "kib_per_call": (busy - idle) / 1024 / in_flight}


def rss_in_flight(bench: Bench, in_flight: int) -> dict[str, Any]:
    """Resident memory of B and of a dlqapp worker idle, then with `in_flight` calls
    waiting at a mock that answers only after minutes (counted at the mock)."""
    mock = MockLLM(bench.tmp, args=["--latency-ms", str(RSS_HOLD_MS)]).start()
    out: dict[str, Any] = {"in_flight": in_flight}
    try:
        for name, start in (
            ("baseline_b_aiokafka", lambda: bench.start_baseline_b(mock, in_flight)),
            ("dlqapp", lambda: bench.start_dlqapp(mock, in_flight, DLQ_INFERENCE_TIMEOUT="30m")),
        ):
            out[name] = _rss_of(bench, name, start(), mock, in_flight)
            print(f"  {name} with {in_flight} calls in flight: {json.dumps(out[name])}", flush=True)
    finally:
        mock.stop()
    return out


# -- the backend's HTTP client alone ---------------------------------------------------

HTTP_CLIENTS = ("aiohttp", "dlqapp")


def http_client(bench: Bench) -> dict[str, Any]:
    """The backend's HTTP client alone: aiohttp's (dlqapp's until 2026-12-06) beside dlqapp's
    own (dlqapp.inference.http_pool), each in its own process in turn in every run, against
    the mock at the `llm_scale` latency and calls in flight: CPU µs per call."""
    calls, runs, latency, in_flight = (200, 1, 0, 64) if bench.quick else (8_000, 3, LLM_LATENCY_MS, LLM_CONCURRENCY)
    calls, runs = bench.requests or calls, bench.runs or runs
    jitter = LLM_JITTER_MS if latency else 0
    mock = MockLLM(bench.tmp, args=["--latency-ms", str(latency), "--jitter-ms", str(jitter), "--seed", "5"]).start()
    script = str(Path(__file__).resolve().parent.parent / "http_clients.py")
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in HTTP_CLIENTS}
    try:
        for run in range(runs):
            for name in HTTP_CLIENTS:
                args = [sys.executable, script, name, mock.api_url + "/chat/completions", str(calls), str(in_flight)]
                done = subprocess.run(args, capture_output=True, text=True, timeout=900, check=True)
                rows[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
                row = rows[name][-1]
                print(f"  run {run + 1} {name}: {row['cpu_us_per_call']:.0f} CPU µs per call", flush=True)
    finally:
        mock.stop()
    out: dict[str, Any] = {"calls": calls, "in_flight": in_flight, "latency_ms": latency, "jitter_ms": jitter}
    for name, measured in rows.items():
        out[name] = {
            "runs": measured,
            **{figure: spread([row[figure] for row in measured]) for figure in ("cpu_us_per_call", "calls_per_s")},
        }
    out["cpu_dlqapp_to_aiohttp"] = (
        out["dlqapp"]["cpu_us_per_call"]["median"] / out["aiohttp"]["cpu_us_per_call"]["median"]
    )
    return out
