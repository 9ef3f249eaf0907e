"""`make bench`: dlqapp side by side with its baselines, measured in one run.

    python bench/run.py [--quick] [--out bench/results]

Starts what it needs (a private Kafka unless KAFKA_BOOTSTRAP is set, dlqapp-mock-llm at a
fixed 100 ms latency) and measures:

1. throughput (requests/s, median of runs) of baseline A (the source documents'
   synchronous consumer), baseline B (a raw aiokafka pass-through with the same
   concurrency) and dlqapp (openai backend against the mock, 0% and 10% failures);
   end-to-end p50/p99 under a paced load; the ratios dlqapp/A and dlqapp/B;
   per-request cost beside B, measured in turn in each of 3 runs: `overhead` (mock at
   0 ms, 64 in flight: what the pipeline itself costs; also with 10% transient failures)
   and `llm_scale` (mock at 2000 ± 500 ms, 1024 in flight, ceiling 512/s), each with the
   CPU seconds per 1,000 requests of each process and of the mock (/proc/<pid>/stat),
   and resident memory with 4,096 calls in flight;
2. retry lateness per tier, idle and under an input flood;
3. timer scale: the timer's tick cost on a store of 1k, 100k and 1M parked retries, and a
   real worker grown to 1k, 100k and 1M parked retries: resident memory per parked retry
   and the lateness of fresh retries at each level;
4. recovery: kill -9 with many parked retries, time until processing again;
5. flow control: 2,000 requests against a provider limited to 600 rpm, with no flow
   control, adaptive concurrency alone, and DLQ_RATE_LIMITS: 429s, attempts, completion.

`--only parked_scale,recovery` runs some sections (the report then holds only those).

Writes latest.json, latest.md, throughput.png, per_request_cost.png and lateness_cdf.png
into --out.
Timing lives here, never in pass/fail tests: `make test` runs only `--quick`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.drivers import (  # noqa: E402
    LoopLagSampler,
    SystemDied,
    make_topics,
    metric_sum,
    parked_gauge,
    produce_in_batches,
    produce_paced,
    requests_for,
    requests_with_plan,
    wait_results,
)
from bench.profiling import Profiler  # noqa: E402
from bench.systems import CONCURRENCY, LATENCY_MS, PYTHON, Running  # noqa: E402
from bench.systems import Bench as Systems  # noqa: E402
from bench.measure import cpu_seconds, percentile, process_memory, spread, throughput_of  # noqa: E402
from bench.demo import markdown as demo_markdown  # noqa: E402
from bench.demo import run_demo  # noqa: E402
from bench.soak import SoakConfig, run_soak  # noqa: E402
from bench.tls_cost import markdown as tls_markdown  # noqa: E402
from bench.tls_cost import run_tls_cost  # noqa: E402
from bench.soak import markdown as soak_markdown  # noqa: E402
from bench.soak import plot as soak_plot  # noqa: E402
from bench.harness import (  # noqa: E402
    LocalKafka,
    MockLLM,
    Record,
    Worker,
    free_port,
    produce,
    read_topic,
    request_bytes,
    unique,
    unique_ids,
    wait_until,
)

PROBES_PER_S = 50
"""Probe requests for retry lateness arrive at this rate, except in the burst and flood scenarios."""
FLOW_LATENCY_MS = 1000
"""Backend latency in the flow-control section (an LLM's, not the mock's 100 ms default)."""
LLM_LATENCY_MS, LLM_JITTER_MS = 2000, 500
LLM_CONCURRENCY = 1024
"""`llm_scale`: model latency people see, and the in-flight count it takes to reach 512/s."""
RSS_IN_FLIGHT = 4096
RSS_HOLD_MS = 600_000
"""Mock latency while resident memory is measured: the calls stay in flight meanwhile."""


# -- helpers -----------------------------------------------------------------------------


def probe_lateness(bootstrap: str, worker: Worker, probes: int, flood_size: int = 0, per_second: int | None = None) -> dict[str, list[float]]:
    """Lateness (attempt start − scheduled_time, ms) per tier of `probes` requests that fail
    three times (a retryable error of their own, not an outage): all at once (their retries fall due together), or `per_second`; optionally
    while `flood_size` fresh requests arrive."""
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
    for record in wait_results(bootstrap, worker.topic("results"), ids, timeout=600):
        for attempt in record.json["history"][1:]:
            per_tier.setdefault(attempt["topic"].split(".")[-1], []).append(attempt["at"] - attempt["scheduled"])
    return per_tier


def seed_request_states(bootstrap: str, changelog: str, count: int) -> list[str]:
    """Write `count` succeeded request states to a `requests` changelog; returns their ids."""
    from dlqapp.core import states

    ids = unique_ids("seed", count)
    at = int(time.time() * 1000)
    for i in range(0, count, 50_000):
        chunk = ids[i : i + 50_000]
        values = [states.dump(states.transition(None, rid, states.SUCCEEDED, at, attempts=1)) for rid in chunk]
        produce(bootstrap, changelog, [(rid.encode(), value) for rid, value in zip(chunk, values)])
    return ids


def lateness_summary(per_tier: dict[str, list[float]]) -> dict[str, dict[str, float | None]]:
    return {
        tier: {"n": len(v), "p50_ms": percentile(v, 0.5), "p99_ms": percentile(v, 0.99), "max_ms": max(v), "min_ms": min(v)}
        for tier, v in sorted(per_tier.items())
    }


def _time_scans(scan: Callable[[], list[bytes]], times: int = 50) -> tuple[list[float], list[bytes]]:
    """Milliseconds of each of `times` scans, and what the last one returned."""
    durations = []
    for _ in range(times):
        started = time.perf_counter()
        keys = scan()
        durations.append((time.perf_counter() - started) * 1000)
    return durations, keys


def ratios(section: dict[str, Any], system: str, base: str) -> dict[str, Any]:
    """`system` / `base` in requests/s: of the medians, and per run (each run measured both in turn)."""
    per_run = [a["requests_per_s"] / b["requests_per_s"] for a, b in zip(section[system]["runs"], section[base]["runs"])]
    return {"of_medians": section[system]["requests_per_s"]["median"] / section[base]["requests_per_s"]["median"], "per_run": per_run}


class Bench(Systems):
    """The sections, measured on the systems `bench.systems.Bench` starts."""

    # -- 1. throughput and latency ------------------------------------------------------

    def throughput(self) -> dict[str, Any]:
        runs = 1 if self.quick else 3
        n_sync = 6 if self.quick else 60
        n_fast = 200 if self.quick else 6000
        systems: dict[str, Callable[[], list[Record]]] = {
            "baseline_a_sync": lambda: self.run_baseline("baseline_sync.py", n_sync),
            "baseline_b_aiokafka": lambda: self.run_baseline("baseline_async.py", n_fast, ["--concurrency", str(CONCURRENCY)]),
            "dlqapp_0pct_failures": lambda: self.run_dlqapp(n_fast, self.mock),
            "dlqapp_10pct_failures": lambda: self.run_dlqapp(n_fast, self.mock_failing),
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
        out["ratio_dlqapp_10pct_to_b"] = out["dlqapp_10pct_failures"]["requests_per_s"] / out["baseline_b_aiokafka"]["requests_per_s"]
        return out

    def paced_latency(self) -> dict[str, Any]:
        """End-to-end p50/p99 at a steady rate well below capacity (produce → result)."""
        rate, seconds = (50, 2) if self.quick else (200, 15)
        out = {}
        for name in ("baseline_b_aiokafka", "dlqapp_0pct_failures"):
            prefix = unique("lat") + "."
            if name == "dlqapp_0pct_failures":
                worker = self.dlqapp_worker(self.mock)
                worker.start()
                input_topic, results_topic, stop = worker.topic("input"), worker.topic("results"), worker.kill
            else:
                settings = make_topics(self.bootstrap, prefix)
                input_topic, results_topic = settings.input, settings.results
                args = [PYTHON, str(ROOT / "bench" / "baseline_async.py"), "--bootstrap", self.bootstrap, "--input", input_topic, "--results", results_topic,
                        "--llm", self.mock.api_url + "/chat/completions", "--group", prefix + "g", "--count", str(rate * seconds), "--concurrency", str(CONCURRENCY)]
                process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                stop = process.kill
            try:
                ids = unique_ids("p", rate * seconds)
                produce_paced(self.bootstrap, input_topic, requests_for(ids), rate)
                results = wait_results(self.bootstrap, results_topic, ids, timeout=300)
                inputs = {r.key.decode(): r.timestamp for r in read_topic(self.bootstrap, input_topic, lambda rs: len(rs) >= len(ids), 60)}
                e2e = [r.timestamp - inputs[r.key.decode()] for r in results]
                out[name] = {"rate_per_s": rate, "e2e_p50_ms": percentile(e2e, 0.5), "e2e_p99_ms": percentile(e2e, 0.99)}
                print(f"  {name} at {rate}/s: p50 {out[name]['e2e_p50_ms']} ms, p99 {out[name]['e2e_p99_ms']} ms", flush=True)
            finally:
                stop()
        return out

    # -- per-request cost: overhead and LLM scale ------------------------------------------

    def cost_run(self, start: Callable[[], "Running"], mock: MockLLM, count: int, profile: str | None = None) -> dict[str, float]:
        """Start a system, hand it `count` requests at once, wait for every outcome: its
        requests/s, and the CPU seconds per 1,000 requests it and the mock used meanwhile.
        With `profile` (and --profile), py-spy records the system meanwhile (see `Profiler`)."""
        system = start()
        profiler = Profiler(self.profile_dir, profile, system.pid) if self.profile_dir and profile else None
        try:
            ids = unique_ids("c", count)
            assert mock.process is not None
            cpu, mock_cpu = cpu_seconds(system.pid), cpu_seconds(mock.process.pid)
            produce_in_batches(self.bootstrap, system.input, requests_for(ids))
            try:
                outcomes = wait_results(self.bootstrap, system.results, ids, timeout=1800, alive=system.alive)
            except SystemDied as exc:
                raise SystemDied(f"{exc} (its log: {system.log})") from None
            cpu, mock_cpu = cpu_seconds(system.pid) - cpu, cpu_seconds(mock.process.pid) - mock_cpu
        finally:
            if profiler is not None:
                profiler.stop()
            system.stop()
        results = [r for r in outcomes if r.topic == system.results[0]]
        return {"requests_per_s": throughput_of(results), "cpu_s_per_1k": cpu * 1000 / count, "mock_cpu_s_per_1k": mock_cpu * 1000 / count,
                "dead_lettered": len(outcomes) - len(results)}

    def cost_run_repeated(self, start: Callable[[], "Running"], mock: MockLLM, count: int, profile: str | None = None, attempts: int = 2) -> dict[str, float]:
        """`cost_run`, once more should the process die (reported, never hidden: `repeated`)."""
        for attempt in range(1, attempts + 1):
            try:
                return {**self.cost_run(start, mock, count, profile), "repeated": attempt - 1}
            except SystemDied as exc:
                print(f"  ! {exc}; attempt {attempt} of {attempts}", flush=True)
                if attempt == attempts:
                    raise
        raise AssertionError("unreachable")

    def side_by_side(self, section: str, systems: dict[str, tuple[Callable[[], "Running"], MockLLM]], count: int, runs: int) -> dict[str, Any]:
        """`runs` rounds, each measuring every system once in turn (so the machine's load
        falls alike on all); per system the runs, and the median and range of each figure.
        With --profile, the first run of each system is recorded as `<section>-<system>`."""
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in systems}
        for run in range(runs):
            for name, (start, mock) in systems.items():
                rows[name].append(self.cost_run_repeated(start, mock, count, profile=f"{section}-{name}" if run == 0 else None))
                row = rows[name][-1]
                print(f"  run {run + 1} {name}: {row['requests_per_s']:.1f} req/s, {row['cpu_s_per_1k']:.2f} CPU s/1k (mock {row['mock_cpu_s_per_1k']:.2f})", flush=True)
        out: dict[str, Any] = {"requests": count}
        for name, measured in rows.items():
            out[name] = {"runs": measured, **{figure: spread([row[figure] for row in measured]) for figure in ("requests_per_s", "cpu_s_per_1k", "mock_cpu_s_per_1k")}}
        return out

    def overhead(self) -> dict[str, Any]:
        """What the pipeline itself costs: the mock answers at once (0 ms), 64 calls in flight;
        dlqapp beside baseline B, and dlqapp again with 10% transient failures (503s)."""
        count, runs = (100, 1) if self.quick else (20_000, 3)
        count, runs = self.requests or count, self.runs or runs
        mock = MockLLM(self.tmp, args=["--latency-ms", "0"]).start()
        failing = MockLLM(self.tmp, args=["--latency-ms", "0", "--fail", "503=0.1", "--seed", "5"]).start()
        try:
            out = self.side_by_side("overhead", {
                "baseline_b_aiokafka": (lambda: self.start_baseline_b(mock, CONCURRENCY), mock),
                "baseline_c_faust": (lambda: self.start_baseline_c(mock, CONCURRENCY), mock),
                "dlqapp_0pct_failures": (lambda: self.start_dlqapp(mock, CONCURRENCY), mock),
                "dlqapp_10pct_failures": (lambda: self.start_dlqapp(failing, CONCURRENCY), failing),
            }, count, runs)
        finally:
            mock.stop()
            failing.stop()
        out["concurrency"], out["latency_ms"] = CONCURRENCY, 0
        out["ratio_dlqapp_to_b"] = ratios(out, "dlqapp_0pct_failures", "baseline_b_aiokafka")
        out["ratio_dlqapp_to_c"] = ratios(out, "dlqapp_0pct_failures", "baseline_c_faust")
        out["ratio_c_to_b"] = ratios(out, "baseline_c_faust", "baseline_b_aiokafka")
        out["ratio_10pct_to_0pct"] = ratios(out, "dlqapp_10pct_failures", "dlqapp_0pct_failures")
        return out

    def llm_scale(self) -> dict[str, Any]:
        """The source documents' load with real model latency: the mock answers in 2000 ± 500 ms,
        1024 calls in flight (ceiling 512/s); dlqapp beside baseline B. Then resident memory
        of each with 4,096 calls in flight (`rss`)."""
        count, runs = (100, 1) if self.quick else (12_000, 3)
        count, runs = self.requests or count, self.runs or runs
        mock = MockLLM(self.tmp, args=["--latency-ms", str(LLM_LATENCY_MS), "--jitter-ms", str(LLM_JITTER_MS), "--seed", "5"]).start()
        try:
            out = self.side_by_side("llm_scale", {
                "baseline_b_aiokafka": (lambda: self.start_baseline_b(mock, LLM_CONCURRENCY), mock),
                "dlqapp_0pct_failures": (lambda: self.start_dlqapp(mock, LLM_CONCURRENCY), mock),
            }, count, runs)
        finally:
            mock.stop()
        ceiling = LLM_CONCURRENCY / (LLM_LATENCY_MS / 1000)
        out.update(concurrency=LLM_CONCURRENCY, latency_ms=LLM_LATENCY_MS, jitter_ms=LLM_JITTER_MS, ceiling_per_s=ceiling)
        out["ratio_dlqapp_to_b"] = ratios(out, "dlqapp_0pct_failures", "baseline_b_aiokafka")
        out["ratio_dlqapp_to_ceiling"] = out["dlqapp_0pct_failures"]["requests_per_s"]["median"] / ceiling
        out["ratio_b_to_ceiling"] = out["baseline_b_aiokafka"]["requests_per_s"]["median"] / ceiling
        out["rss"] = self.rss_in_flight(64 if self.quick else RSS_IN_FLIGHT)
        return out

    def rss_in_flight(self, in_flight: int) -> dict[str, Any]:
        """Resident memory of B and of a dlqapp worker idle, then with `in_flight` calls
        waiting at a mock that answers only after minutes (counted at the mock)."""
        mock = MockLLM(self.tmp, args=["--latency-ms", str(RSS_HOLD_MS)]).start()
        out: dict[str, Any] = {"in_flight": in_flight}
        try:
            for name, start in (("baseline_b_aiokafka", lambda: self.start_baseline_b(mock, in_flight)),
                                ("dlqapp", lambda: self.start_dlqapp(mock, in_flight, DLQ_INFERENCE_TIMEOUT="30m"))):
                system = start()
                try:
                    idle = process_memory(system.pid)["rss_bytes"]
                    calls = mock.stats()["calls"]
                    produce_in_batches(self.bootstrap, system.input, requests_for(unique_ids("rss", in_flight)))

                    def all_in_flight() -> bool:
                        if not system.alive():
                            raise SystemDied(f"{name} exited (its log: {system.log})")
                        return mock.stats()["calls"] - calls >= in_flight

                    wait_until(all_in_flight, 600, f"{in_flight} calls in flight at the mock", interval=0.5)
                    busy = process_memory(system.pid)["rss_bytes"]
                finally:
                    system.stop()
                out[name] = {"idle_rss_mib": idle / 2**20, "rss_mib": busy / 2**20, "kib_per_call": (busy - idle) / 1024 / in_flight}
                print(f"  {name} with {in_flight} calls in flight: {json.dumps(out[name])}", flush=True)
        finally:
            mock.stop()
        return out

    # -- 2. retry lateness ---------------------------------------------------------------

    def lateness(self) -> dict[str, Any]:
        """Retry lateness per tier: `idle` (probes paced, nothing else to do),
        `paced_under_flood` (the same probes while a flood of fresh input drains), `burst` (all
        probes at once, so their retries fall due together and queue for backend slots) and
        `under_flood` (a burst, then a flood while the retries wait). Each scenario runs 5 times (once with
        --quick) on a fresh worker; each run's p99 per tier and the worst event-loop lag the
        worker reported during it are kept, and summarised as min / median / max."""
        probes = 10 if self.quick else 300
        flood = 300 if self.quick else 20_000
        runs = 1 if self.quick else LATENESS_RUNS
        out: dict[str, Any] = {}
        scenarios = tuple(zip(LATENESS_SCENARIOS, (0, flood, 0, flood), (PROBES_PER_S, PROBES_PER_S, None, None)))
        for label, flood_size, per_second in scenarios:
            per_run: list[dict[str, Any]] = []
            samples: list[float] = []
            for run in range(runs):
                worker = self.simulated_worker(latency_ms=LATENCY_MS)
                worker.start()
                try:
                    with LoopLagSampler(worker) as lag:
                        per_tier = probe_lateness(self.bootstrap, worker, probes, flood_size, per_second)
                    row = {"per_tier": lateness_summary(per_tier), "loop_lag_max_ms": lag.max_ms}
                    per_run.append(row)
                    samples += [x for v in per_tier.values() for x in v]
                    print(f"  lateness {label} run {run + 1}: {json.dumps(row)}", flush=True)
                finally:
                    worker.kill()
            tiers = per_run[0]["per_tier"].keys()
            out[label] = {
                tier: {
                    "n": sum(r["per_tier"][tier]["n"] for r in per_run),
                    "p50_ms": spread([r["per_tier"][tier]["p50_ms"] for r in per_run]),
                    "p99_ms": spread([r["per_tier"][tier]["p99_ms"] for r in per_run]),
                    "max_ms": max(r["per_tier"][tier]["max_ms"] for r in per_run),
                }
                for tier in tiers
            }
            out[label + "_loop_lag_max_ms"] = spread([r["loop_lag_max_ms"] for r in per_run])
            out[label + "_worst_tier_p99_ms"] = spread([max(t["p99_ms"] for t in r["per_tier"].values()) for r in per_run])
            out[label + "_runs"] = per_run
            out[label + "_samples"] = sorted(samples)
        out["flood_to_idle_worst_tier_p99"] = out["under_flood_worst_tier_p99_ms"]["median"] / max(1.0, out["idle_worst_tier_p99_ms"]["median"])
        out["paced_flood_to_idle_worst_tier_p99"] = out["paced_under_flood_worst_tier_p99_ms"]["median"] / max(1.0, out["idle_worst_tier_p99_ms"]["median"])
        out["flood_to_burst_worst_tier_p99"] = out["under_flood_worst_tier_p99_ms"]["median"] / max(1.0, out["burst_worst_tier_p99_ms"]["median"])
        return out

    # -- stats cost -------------------------------------------------------------------------

    def stats_cost(self) -> dict[str, Any]:
        """`GET /dlq/stats/` and `GET /metrics` latency (p50/p99 of 200 calls each) and RSS of
        a worker whose `requests` table holds N settled request states, beside one holding
        1k. The states are written to each worker's changelog once; each of 3 runs (1 with
        --quick) restarts both workers, which then hold the states in RocksDB."""
        sizes = (200, 1_000) if self.quick else (1_000, STATS_COST_LARGE)
        runs = 1 if self.quick else 3
        workers = {size: self._seeded_worker(size) for size in sizes}
        samples: dict[int, list[dict[str, float]]] = {size: [] for size in sizes}
        for run in range(runs):
            for size, (worker, seeded) in workers.items():
                samples[size].append(self._stats_cost_once(worker, seeded[run * 20 : (run + 1) * 20]))
                print(f"  stats cost run {run + 1} at {size:,}: {json.dumps(samples[size][-1])}", flush=True)
        out: dict[str, Any] = {}
        for size, rows in samples.items():
            out[str(size)] = {"requests": size, "runs": rows, **{name: spread([row[name] for row in rows]) for name in rows[0]}}
        small, large = (samples[n] for n in sizes)
        out["p99_ratio_large_to_small"] = spread([b["stats_p99_ms"] / a["stats_p99_ms"] for a, b in zip(small, large)])
        return out

    def _seeded_worker(self, size: int) -> tuple[Worker, list[str]]:
        """A worker (stopped) whose `requests` changelog holds `size` succeeded states."""
        worker = self.simulated_worker(latency_ms=1)
        worker.start()  # creates the topics; the states then go in through the changelog
        worker.kill()
        return worker, seed_request_states(self.bootstrap, f"{worker.app_id}-requests-changelog", size)

    def _stats_cost_once(self, worker: Worker, known_ids: list[str]) -> dict[str, float]:
        """Start `worker`, prove its states are there, time the reads, stop it."""
        started = time.monotonic()
        worker.start(wait=False)
        try:
            worker.wait_ready(timeout=3600)  # the first start restores every state from the changelog
            start_s = time.monotonic() - started
            stats = lambda: worker.get("/dlq/stats/")[1]  # noqa: E731
            skipped_before = stats().get("duplicates_skipped", 0)
            produce(self.bootstrap, worker.topic("input"), requests_for(known_ids))  # succeeded already: skipped
            wait_until(lambda: stats().get("duplicates_skipped", 0) >= skipped_before + len(known_ids), 300, "the seeded ids skipped as duplicates")
            row: dict[str, float] = {"start_s": round(start_s, 1)}
            for name, path in (("stats", "/dlq/stats/"), ("metrics", "/metrics")):
                times = []
                for _ in range(200):
                    began = time.perf_counter()
                    with urllib.request.urlopen(worker.url + path, timeout=30) as response:
                        response.read()
                    times.append((time.perf_counter() - began) * 1000)
                row[f"{name}_p50_ms"] = round(percentile(times, 0.5), 2)
                row[f"{name}_p99_ms"] = round(percentile(times, 0.99), 2)
            row["rss_mib"] = round(process_memory(worker.process.pid)["rss_bytes"] / 2**20)
            return row
        finally:
            worker.kill()

    # -- 3. timer scale ------------------------------------------------------------------

    def timer_tick(self) -> dict[str, Any]:
        """The timer's own scan (dlqapp.retries.scan.scan_due) over a RocksDB with N parked entries,
        then after `churn` retries were fired and deleted (their tombstones sit at the head):
        scanning from the first key, as a naive timer would, and from the start the worker keeps."""
        from rocksdict import Options, Rdict

        from dlqapp.core.clock import now_ms
        from dlqapp.core.envelope import Envelope
        from dlqapp.retries.keys import parked_key
        from dlqapp.retries.scan import scan_due

        sizes = (1_000, 10_000) if self.quick else (1_000, 100_000, 1_000_000)
        churn = 10_000 if self.quick else 100_000
        due_now, batch = 100, 500
        out: dict[str, Any] = {}
        blob = Envelope("r" * 24, request_bytes("r" * 24), 0, {"topic": "input", "partition": 0, "offset": 0}).to_bytes()
        for size in sizes:
            path = self.tmp / f"timer-{size}"
            db = Rdict(str(path), Options(raw_mode=True))
            now = now_ms()
            for i in range(size):
                due = now - 1000 + i if i < due_now else now + 600_000 + i  # `due_now` are due, the rest wait
                db.put(parked_key(due, f"req-{i:08d}"), blob)
            db.flush()
            ticks, keys = _time_scans(lambda: scan_due(db, now, None, {}, batch)[0])
            assert len(keys) == due_now
            disk = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
            for i in range(churn):
                key = parked_key(now - 100_000 + i, f"fired-{i:08d}")
                db.put(key, blob)
                db.delete(key)
            naive, _ = _time_scans(lambda: scan_due(db, now, None, {}, batch)[0])
            _, start = scan_due(db, now, None, {}, batch)
            kept, keys = _time_scans(lambda: scan_due(db, now, start, {}, batch)[0])
            assert len(keys) == due_now
            db.close()
            shutil.rmtree(path, ignore_errors=True)
            out[str(size)] = {
                "tick_ms_median": statistics.median(ticks),
                "tick_ms_p99": percentile(ticks, 0.99),
                "disk_bytes_per_entry": disk / size,
                "after_churn": churn,
                "tick_after_churn_from_first_key_ms": statistics.median(naive),
                "tick_after_churn_from_kept_start_ms": statistics.median(kept),
            }
            print(f"  timer tick with {size} parked: {out[str(size)]}", flush=True)
        base = out[str(sizes[0])]["tick_ms_median"]
        for size in sizes:
            out[str(size)]["tick_ratio_to_1k"] = out[str(size)]["tick_ms_median"] / base
        return out

    def parked_scale(self) -> dict[str, Any]:
        """One real worker grown to 1k, 100k and 1M parked retries (due in a day): at each
        level, resident memory per parked retry and the lateness of fresh retries."""
        levels = (100, 1_000) if self.quick else (1_000, 100_000, 1_000_000)
        probes = 10 if self.quick else 200
        worker = self.simulated_worker(latency_ms=1, DLQ_CONCURRENCY="256")
        worker.start()
        assert worker.process is not None
        try:
            probe_lateness(self.bootstrap, worker, probes)  # warm every code path before the empty baseline
            warm = unique_ids("warm", 1000)
            produce(self.bootstrap, worker.topic("input"), requests_for(warm))
            wait_results(self.bootstrap, worker.topic("results"), warm, timeout=300)
            empty = process_memory(worker.process.pid)["rss_bytes"]
            out: dict[str, Any] = {"empty_worker_rss_bytes": empty}
            parked, previous_rss = 0, empty
            for level in levels:
                loading = time.monotonic()
                ids = unique_ids(f"park{level}", level - parked)
                produce_in_batches(self.bootstrap, worker.topic("input"), requests_with_plan(ids, fail_times=1, error="rate_limited", retry_after=86_400))
                wait_until(lambda: parked_gauge(worker) >= level, 3600, f"{level} parked retries", interval=2.0)
                load_s = time.monotonic() - loading
                # The tier agents still read the retries' tier messages: measure a settled worker.
                wait_until(lambda: metric_sum(worker, "dlqapp_consumer_lag") == 0, 600, "the worker to catch up", interval=1.0)
                previous_level, parked = parked, level
                exact = worker.get("/retries/?limit=1")[1]["total"]
                memory = process_memory(worker.process.pid)
                per_tier = probe_lateness(self.bootstrap, worker, probes, per_second=PROBES_PER_S)
                all_tiers = [x for v in per_tier.values() for x in v]
                out[str(level)] = {
                    "parked": exact,
                    "load_s": round(load_s, 1),
                    **memory,
                    "rss_bytes_per_parked": (memory["rss_bytes"] - empty) / level,
                    "rss_bytes_per_added_parked": (memory["rss_bytes"] - previous_rss) / (level - previous_level),
                    "lateness_p50_ms": percentile(all_tiers, 0.5),
                    "lateness_p99_ms": percentile(all_tiers, 0.99),
                    "lateness_max_ms": max(all_tiers),
                    "lateness_min_ms": min(all_tiers),
                    "per_tier": lateness_summary(per_tier),
                }
                out[f"{level:,} parked_samples"] = all_tiers
                previous_rss = memory["rss_bytes"]
                print(f"  worker with {level} parked: {json.dumps({k: v for k, v in out[str(level)].items() if k != 'per_tier'})}", flush=True)
            base = out[str(levels[0])]["lateness_p99_ms"]
            for level in levels:
                out[str(level)]["lateness_p99_ratio_to_first"] = out[str(level)]["lateness_p99_ms"] / base if base else None
            return out
        finally:
            worker.kill()

    # -- 5. flow control -------------------------------------------------------------------

    def flow_control(self) -> dict[str, Any]:
        """The same load against a provider limited to `rpm` (dlqapp-mock-llm --limit-rpm, 1 s
        latency): with no flow control (a fixed DLQ_CONCURRENCY, as before), with adaptive
        concurrency alone, and with DLQ_RATE_LIMITS at the provider's limit. 429s the provider
        sent, attempts per request, dead letters, time until every request has an outcome."""
        rpm, count = (3000, 150) if self.quick else (600, 2000)
        model = "bench-model"
        setups = {
            "none": {"DLQ_ADAPTIVE_CONCURRENCY": "false"},
            "adaptive_concurrency": {"DLQ_ADAPTIVE_CONCURRENCY": "true"},
            "rate_limits": {"DLQ_ADAPTIVE_CONCURRENCY": "true", "DLQ_RATE_LIMITS": f"{model}={rpm}rpm"},
        }
        out: dict[str, Any] = {"provider_rpm": rpm, "requests": count, "latency_ms": FLOW_LATENCY_MS}
        for name, env in setups.items():
            mock = MockLLM(self.tmp, args=["--latency-ms", str(FLOW_LATENCY_MS), "--jitter-ms", str(FLOW_LATENCY_MS // 5), "--limit-rpm", str(rpm), "--seed", "3"]).start()
            worker = self.dlqapp_worker(mock, DLQ_RETRY_DELAYS="1s,10s,1m", **env)
            try:
                worker.start()
                ids = unique_ids("fc", count)
                started = time.monotonic()
                produce(self.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid, model=model)) for rid in ids])
                outcomes = wait_results(self.bootstrap, [worker.topic("results"), worker.topic("dlq")], ids, timeout=3600)
                elapsed = time.monotonic() - started
                stats = mock.stats()
                succeeded = [r for r in outcomes if r.topic == worker.topic("results")]
                out[name] = {
                    "calls": stats["calls"],
                    "429s": stats["throttled"],
                    "429_share": stats["throttled"] / stats["calls"],
                    "attempts_per_request": stats["calls"] / count,
                    "succeeded": len(succeeded),
                    "dead_lettered": count - len(succeeded),
                    "completion_s": round(elapsed, 1),
                    "outcomes_per_min": round(count / elapsed * 60, 1),
                }
                print(f"  flow control {name}: {json.dumps(out[name])}", flush=True)
            finally:
                worker.kill()
                mock.stop()
        return out

    # -- 4. recovery ---------------------------------------------------------------------

    def partition_cost(self) -> dict[str, Any]:
        """What more partitions cost one worker: start to ready, resident memory and CPU while
        idle (the timer and the sweeps visit every partition), the event loop's worst lag."""
        counts = (3, 12) if self.quick else PARTITION_COUNTS
        runs = 1 if self.quick else 3
        idle_s = 3 if self.quick else 15
        out: dict[str, Any] = {}
        for count in counts:
            samples: dict[str, list[float]] = {"start_to_ready_s": [], "rss_mib": [], "idle_cpu_pct": [], "loop_lag_ms": []}
            for _ in range(runs):
                worker = self.simulated_worker(latency_ms=1, DLQ_PARTITIONS=str(count))
                started = time.monotonic()
                worker.start()
                try:
                    samples["start_to_ready_s"].append(time.monotonic() - started)
                    pid = worker.process.pid
                    cpu_before, idle_from = cpu_seconds(pid), time.monotonic()
                    with LoopLagSampler(worker) as lag:
                        time.sleep(idle_s)  # a fixed idle window is the measurement itself
                    samples["idle_cpu_pct"].append(100 * (cpu_seconds(pid) - cpu_before) / (time.monotonic() - idle_from))
                    samples["rss_mib"].append(process_memory(pid)["rss_bytes"] / 2**20)
                    samples["loop_lag_ms"].append(lag.max_ms)
                finally:
                    worker.stop()
            out[str(count)] = {name: spread(values) for name, values in samples.items()}
            print(f"  partitions {count}: {out[str(count)]}", flush=True)
        return out

    def scale_out(self) -> dict[str, Any]:
        """Workers joining under a steady load: 1, then 2, then 4, each step `SCALE_STEP_S`
        long, requests at `SCALE_RATE` per second on the simulated backend at 1 s latency
        (one worker's ceiling: DLQ_CONCURRENCY per second), 10% failing once (a retry each,
        1 s later). Per step: results per second, request latency (input written → result
        written), retry lateness (attempt − due time), the longest pause between results; at the end, every request's outcome. Median
        and range of `SCALE_RUNS` runs."""
        step_s = 10 if self.quick else SCALE_STEP_S
        rate = 30 if self.quick else SCALE_RATE
        runs = [self._scale_once(step_s, rate) for _ in range(1 if self.quick else SCALE_RUNS)]
        steps = {label: {name: spread([run["steps"][label][name] for run in runs]) for name in runs[0]["steps"][label]} for label in runs[0]["steps"]}
        out = {"rate_per_s": rate, "step_s": step_s, "partitions": SCALE_PARTITIONS, "requests": runs[0]["requests"], "runs": len(runs), "lost": sum(run["lost"] for run in runs), "steps": steps}
        print(f"  scale_out: {out}", flush=True)
        return out

    def _scale_once(self, step_s: int, rate: int) -> dict[str, Any]:
        env = {"DLQ_PARTITIONS": str(SCALE_PARTITIONS), "DLQ_RETRY_DELAYS": "1s,10s,60s"}
        first = self.simulated_worker(latency_ms=FLOW_LATENCY_MS, **env)
        workers = [first]
        first.start()
        ids = unique_ids("scale", rate * step_s * 3)
        failing = set(ids[::10])
        records = [(rid.encode(), request_bytes(rid, **({"metadata": {"simulate": {"fail_times": 1, "error": "unknown"}}} if rid in failing else {}))) for rid in ids]
        feeder = threading.Thread(target=produce_paced, args=(self.bootstrap, first.topic("input"), records, rate), daemon=True)
        try:
            started_ms = time.time() * 1000
            feeder.start()
            joins_ms = []
            for joining in (1, 2):
                time.sleep(step_s)  # each step runs for a fixed time: the measurement itself
                joins_ms.append(time.time() * 1000)
                for _ in range(joining):
                    worker = Worker(self.bootstrap, self.tmp, app_id=first.app_id, prefix=first.prefix, name=unique("bw"), env_extra=first.env_extra)
                    worker.start(wait=False)
                    workers.append(worker)
            feeder.join()
            outcomes = wait_results(self.bootstrap, [first.topic("results"), first.topic("dlq")], ids, timeout=600, partitions=SCALE_PARTITIONS)
            sent = {r.key.decode(): r.timestamp for r in read_topic(self.bootstrap, first.topic("input"), lambda got: len(got) >= len(ids), 120, partitions=SCALE_PARTITIONS)}
        finally:
            for worker in workers:
                worker.stop()
        bounds = [started_ms, *joins_ms, max(r.timestamp for r in outcomes) + 1]
        steps = {}
        for index, label in enumerate(("1 worker", "2 workers", "4 workers")):
            low, high = bounds[index], bounds[index + 1]
            inside = sorted(r.timestamp for r in outcomes if low <= r.timestamp < high)
            latency = [(r.timestamp - sent[r.key.decode()]) / 1000 for r in outcomes if low <= r.timestamp < high and r.key.decode() in sent]
            gaps = [b - a for a, b in zip(inside, inside[1:])]
            retried = [r for r in outcomes if low <= r.timestamp < high and r.topic.endswith("results")]
            late = [a["at"] - a["scheduled"] for r in retried for a in (r.json.get("history") or [])[1:] if a.get("scheduled")]
            steps[label] = {
                "results_per_s": round(len(inside) / ((high - low) / 1000), 1),
                "latency_p50_s": round(percentile(latency, 0.5) or 0, 2),
                "latency_p99_s": round(percentile(latency, 0.99) or 0, 2),
                "longest_pause_s": round(max(gaps, default=0) / 1000, 2),
                "retry_lateness_p50_ms": round(percentile(late, 0.5) or 0),
                "retry_lateness_p99_ms": round(percentile(late, 0.99) or 0),
            }
        lost = len(set(ids) - {r.key.decode() for r in outcomes})
        print(f"  scale_out run: lost {lost}, {steps}", flush=True)
        return {"requests": len(ids), "lost": lost, "steps": steps}

    def demo(self) -> dict[str, Any]:
        """The README demo on fresh topics, measured (bench/demo.py)."""
        return run_demo(self.bootstrap, self.tmp, runs=1 if self.quick else 3)

    def tls_cost(self) -> dict[str, Any]:
        """dlqapp on plaintext beside SASL_SSL under the overhead and llm_scale loads (bench/tls_cost.py)."""
        return run_tls_cost(self.bootstrap, self.tmp, runs=1 if self.quick else (self.runs or 3), requests=100 if self.quick else self.requests)

    def soak(self) -> dict[str, Any]:
        """Steady state under a flaky provider with one outage (bench/soak.py); SOAK_S sets its length."""
        result = run_soak(self.bootstrap, self.tmp, SoakConfig(duration_s=SOAK_S if not self.quick else 60, outage_s=20 if not self.quick else 5))
        return result

    def recovery(self) -> dict[str, Any]:
        parked = 200 if self.quick else 100_000
        worker = self.simulated_worker(latency_ms=1, DLQ_RETRY_DELAYS="30m,31m,32m", DLQ_SESSION_TIMEOUT="6s")
        worker.start()
        try:
            ids = unique_ids("park", parked)
            loading = time.monotonic()
            produce_in_batches(self.bootstrap, worker.topic("input"), requests_with_plan(ids, fail_times=1, error="server_error"))
            wait_until(lambda: parked_gauge(worker) >= parked, 1800, f"{parked} parked retries", interval=1.0)
            load_s = time.monotonic() - loading
            worker.kill()
            killed = time.monotonic()
            worker.start(wait=False)
            worker.wait_ready(timeout=900)
            ready_s = time.monotonic() - killed
            probe = unique("after-recovery")
            produce(self.bootstrap, worker.topic("input"), [(probe.encode(), request_bytes(probe))])
            wait_results(self.bootstrap, worker.topic("results"), [probe], timeout=300)
            processing_s = time.monotonic() - killed
            survived = worker.get("/retries/?limit=1")[1]["total"]
            out = {"parked": parked, "load_s": round(load_s, 1), "kill_to_ready_s": round(ready_s, 1), "kill_to_processing_s": round(processing_s, 1), "parked_after_restart": survived}
            print(f"  recovery: {out}", flush=True)
            return out
        finally:
            worker.kill()


# -- report --------------------------------------------------------------------------------


def write_report(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    samples = {}
    for section in ("lateness", "parked_scale"):
        for key in [k for k in results.get(section, {}) if k.endswith("_samples")]:
            samples[f"{section}/{key.removesuffix('_samples')}"] = results[section].pop(key)
    (out / "latest.json").write_text(json.dumps(results, indent=2))
    (out / "latest.md").write_text(markdown(results))
    plots(results, samples, out)
    for section in ("demo",):
        if section in results:
            (out / f"{section}.json").write_text(json.dumps({"when": results["when"], "machine": results["machine"], **results[section]}, indent=2))
    if "tls_cost" in results:
        (out / "tls_cost.json").write_text(json.dumps({"when": results["when"], "machine": results["machine"], **results["tls_cost"]}, indent=2))
    if "soak" in results:
        (out / "soak.json").write_text(json.dumps({"when": results["when"], "machine": results["machine"], **results["soak"]}, indent=2))
        soak_plot(results["soak"], out)


def markdown(r: dict[str, Any]) -> str:
    header = f"{r['when']} on {r['machine']}; backend latency {LATENCY_MS} ms, concurrency {CONCURRENCY}" + (" (quick)" if r["quick"] else "")
    lines = ["# dlqapp benchmark", "", header, ""]
    for section, render in (("throughput", _md_throughput), ("overhead", _md_overhead), ("llm_scale", _md_llm_scale), ("latency", _md_latency), ("lateness", _md_lateness),
                            ("timer", _md_timer), ("parked_scale", _md_parked_scale), ("recovery", _md_recovery), ("stats_cost", _md_stats_cost),
                            ("flow_control", _md_flow_control), ("partitions", _md_partitions), ("scale_out", _md_scale_out), ("soak", soak_markdown), ("tls_cost", tls_markdown), ("demo", demo_markdown)):
        if section in r:
            lines += render(r[section]) + [""]
    return "\n".join(lines)


def _md_throughput(t: dict[str, Any]) -> list[str]:
    lines = ["| System | Requests/s (median) | Runs |", "|---|---|---|"]
    for name in SYSTEMS:
        lines.append(f"| {name} | {t[name]['requests_per_s']:.1f} | {', '.join(f'{x:.1f}' for x in t[name]['runs'])} |")
    return lines + ["", f"dlqapp / A = **{t['ratio_dlqapp_to_a']:.1f}×**, dlqapp / B = **{t['ratio_dlqapp_to_b']:.2f}×** (10% failures: {t['ratio_dlqapp_10pct_to_b']:.2f}× of B)"]


def _cell(figure: dict[str, float], digits: int = 1) -> str:
    """Median (min–max) of one figure over runs."""
    return f"{figure['median']:.{digits}f} ({figure['min']:.{digits}f}–{figure['max']:.{digits}f})"


def _md_cost_rows(section: dict[str, Any], systems: tuple[str, ...]) -> list[str]:
    lines = ["| System | Requests/s median (min–max) | Runs | CPU s per 1k requests | mock LLM CPU s per 1k |", "|---|---|---|---|---|"]
    for name in systems:
        v = section[name]
        runs = ", ".join(f"{row['requests_per_s']:.1f}" for row in v["runs"])
        lines.append(f"| {name} | {_cell(v['requests_per_s'])} | {runs} | {_cell(v['cpu_s_per_1k'], 2)} | {_cell(v['mock_cpu_s_per_1k'], 2)} |")
    return lines


def _md_ratio(ratio: dict[str, Any]) -> str:
    return f"**{ratio['of_medians']:.2f}×** (per run: {', '.join(f'{x:.2f}' for x in ratio['per_run'])})"


def _md_overhead(o: dict[str, Any]) -> list[str]:
    lines = [f"## overhead: mock LLM at 0 ms, {o['concurrency']} in flight, {o['requests']:,} requests per run", ""]
    lines += _md_cost_rows(o, ("baseline_b_aiokafka", "baseline_c_faust", "dlqapp_0pct_failures", "dlqapp_10pct_failures"))
    return lines + ["", f"dlqapp / B = {_md_ratio(o['ratio_dlqapp_to_b'])}; dlqapp / C (Faust's floor) = {_md_ratio(o['ratio_dlqapp_to_c'])}; C / B = {_md_ratio(o['ratio_c_to_b'])}; "
                        f"dlqapp with 10% transient failures / dlqapp at 0% = {_md_ratio(o['ratio_10pct_to_0pct'])}"]


def _md_llm_scale(s: dict[str, Any]) -> list[str]:
    lines = [f"## llm_scale: mock LLM at {s['latency_ms']} ± {s['jitter_ms']} ms, {s['concurrency']} in flight (ceiling {s['ceiling_per_s']:.0f}/s), {s['requests']:,} requests per run", ""]
    lines += _md_cost_rows(s, ("baseline_b_aiokafka", "dlqapp_0pct_failures"))
    lines += ["", f"dlqapp / B = {_md_ratio(s['ratio_dlqapp_to_b'])}; dlqapp / ceiling = **{s['ratio_dlqapp_to_ceiling']:.2f}×**, B / ceiling = {s['ratio_b_to_ceiling']:.2f}×", ""]
    rss = s["rss"]
    lines += [f"| Resident memory, {rss['in_flight']:,} calls in flight | idle MiB | in flight MiB | KiB per call |", "|---|---|---|---|"]
    for name in ("baseline_b_aiokafka", "dlqapp"):
        v = rss[name]
        lines.append(f"| {name} | {v['idle_rss_mib']:.0f} | {v['rss_mib']:.0f} | {v['kib_per_call']:.1f} |")
    return lines


def _md_latency(latency: dict[str, Any]) -> list[str]:
    lines = ["| Paced end-to-end | Rate | p50 ms | p99 ms |", "|---|---|---|---|"]
    return lines + [f"| {name} | {v['rate_per_s']}/s | {v['e2e_p50_ms']} | {v['e2e_p99_ms']} |" for name, v in latency.items()]


def _md_lateness(lateness: dict[str, Any]) -> list[str]:
    cell = lambda s: f"{s['median']:.0f} ({s['min']:.0f}–{s['max']:.0f})"  # noqa: E731
    lines = ["Median of runs (min–max over runs); each run a fresh worker.", "",
             "| Retry lateness | Tier | n | p50 ms | p99 ms | max ms | loop lag max ms |", "|---|---|---|---|---|---|---|"]
    for label in LATENESS_SCENARIOS:
        for tier, v in lateness[label].items():
            lines.append(f"| {label} | {tier} | {v['n']} | {cell(v['p50_ms'])} | {cell(v['p99_ms'])} | {v['max_ms']} | {cell(lateness[label + '_loop_lag_max_ms'])} |")
    worst = lambda label: cell(lateness[label + "_worst_tier_p99_ms"])  # noqa: E731
    lines += ["", f"Worst tier p99: idle {worst('idle')} ms, paced under the flood {worst('paced_under_flood')} ms, burst {worst('burst')} ms, "
              f"burst under the flood {worst('under_flood')} ms. At the median: paced flood / idle **{lateness['paced_flood_to_idle_worst_tier_p99']:.1f}×**, "
              f"burst flood / burst **{lateness['flood_to_burst_worst_tier_p99']:.1f}×**, burst flood / idle {lateness['flood_to_idle_worst_tier_p99']:.1f}×"]
    return lines


def _md_timer(timer: dict[str, Any]) -> list[str]:
    churn = next(iter(timer.values()))["after_churn"]
    lines = [f"| Timer tick (standalone scan) | Tick ms (median) | Ratio to 1k | Disk bytes/entry | After {churn:,} fired: from first key ms | from kept start ms |", "|---|---|---|---|---|---|"]
    return lines + [f"| {int(size):,} parked | {v['tick_ms_median']:.3f} | {v['tick_ratio_to_1k']:.2f} | {v['disk_bytes_per_entry']:.0f} "
                    f"| {v['tick_after_churn_from_first_key_ms']:.3f} | {v['tick_after_churn_from_kept_start_ms']:.3f} |" for size, v in timer.items()]


def _md_parked_scale(scale: dict[str, Any]) -> list[str]:
    lines = [f"Worker RSS with nothing parked (after warm-up): {scale['empty_worker_rss_bytes'] / 2**20:.0f} MiB", "",
             "| Worker holding | Load s | RSS MiB | Peak RSS MiB | RSS bytes/parked | per parked since the previous level | Lateness p50 ms | p99 ms | max ms | p99 ratio to first |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for level, v in scale.items():
        if isinstance(v, dict):
            lines.append(f"| {int(level):,} parked | {v['load_s']} | {v['rss_bytes'] / 2**20:.0f} | {v['peak_rss_bytes'] / 2**20:.0f} | {v['rss_bytes_per_parked']:.0f} | {v['rss_bytes_per_added_parked']:.0f} "
                         f"| {v['lateness_p50_ms']} | {v['lateness_p99_ms']} | {v['lateness_max_ms']} | {v['lateness_p99_ratio_to_first']:.2f} |")
    return lines


def _md_recovery(rec: dict[str, Any]) -> list[str]:
    return [f"Recovery with {rec['parked']:,} parked retries: kill -9 → ready {rec['kill_to_ready_s']} s, → processing {rec['kill_to_processing_s']} s; {rec['parked_after_restart']:,} parked after restart."]


def _md_partitions(p: dict[str, Any]) -> list[str]:
    lines = ["| DLQ_PARTITIONS | start → ready, s | RSS idle, MiB | CPU idle, % | worst loop lag, ms |", "|---|---|---|---|---|"]
    for count, f in p.items():
        lines.append(f"| {count} | {_cell(f['start_to_ready_s'])} | {_cell(f['rss_mib'], 0)} | {_cell(f['idle_cpu_pct'])} | {_cell(f['loop_lag_ms'], 0)} |")
    return lines


def _md_scale_out(o: dict[str, Any]) -> list[str]:
    lines = [f"Workers joining under {o['rate_per_s']} requests/s ({o['requests']:,} requests a run, {o['partitions']} partitions, 1 s backend latency, 10% failing once; "
             f"median (min–max) of {o['runs']} runs): lost {o['lost']}.", "",
             "| Step | Results/s | Latency p50, s | Latency p99, s | Retry lateness p50, ms | Retry lateness p99, ms | Longest pause, s |", "|---|---|---|---|---|---|---|"]
    for label, f in o["steps"].items():
        lines.append(f"| {label} | {_cell(f['results_per_s'])} | {_cell(f['latency_p50_s'])} | {_cell(f['latency_p99_s'])} | {_cell(f['retry_lateness_p50_ms'], 0)} "
                     f"| {_cell(f['retry_lateness_p99_ms'], 0)} | {_cell(f['longest_pause_s'])} |")
    return lines


SYSTEMS = ("baseline_a_sync", "baseline_b_aiokafka", "dlqapp_0pct_failures", "dlqapp_10pct_failures")


def _md_stats_cost(cost: dict[str, Any]) -> list[str]:
    rows = ["## /dlq/stats/ and /metrics cost (median of runs, min–max)", "",
            "| request states in the table | start s (1st run restores) | stats p50 ms | stats p99 ms | metrics p50 ms | metrics p99 ms | RSS MiB |", "|---|---|---|---|---|---|---|"]
    cell = lambda s: f"{s['median']:.1f} ({s['min']:.1f}–{s['max']:.1f})"  # noqa: E731
    for row in cost.values():
        if isinstance(row, dict) and "requests" in row:
            rows.append(f"| {row['requests']:,} | {cell(row['start_s'])} | {cell(row['stats_p50_ms'])} | {cell(row['stats_p99_ms'])} | {cell(row['metrics_p50_ms'])} | {cell(row['metrics_p99_ms'])} | {cell(row['rss_mib'])} |")
    ratio = cost["p99_ratio_large_to_small"]
    rows.append(f"\nstats p99 ratio, large to small, per run: median {ratio['median']:.2f}× ({ratio['min']:.2f}–{ratio['max']:.2f}×)")
    return rows


def _md_flow_control(flow: dict[str, Any]) -> list[str]:
    rows = [f"## Flow control: {flow['requests']:,} requests, provider limited to {flow['provider_rpm']} rpm, {flow['latency_ms']} ms latency", "",
            "| dlqapp | 429s sent | share of calls | attempts per request | succeeded | dead-lettered | completion s | outcomes/min |", "|---|---|---|---|---|---|---|---|"]
    for name in FLOW_SETUPS:
        if name in flow:
            v = flow[name]
            rows.append(f"| {name} | {v['429s']:,} | {v['429_share']:.1%} | {v['attempts_per_request']:.2f} | {v['succeeded']:,} | {v['dead_lettered']:,} | {v['completion_s']} | {v['outcomes_per_min']} |")
    return rows


FLOW_SETUPS = ("none", "adaptive_concurrency", "rate_limits")


def plots(r: dict[str, Any], samples: dict[str, list[float]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "throughput" in r:
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.bar(["A: sync", "B: aiokafka", "dlqapp 0%", "dlqapp 10%"], [r["throughput"][n]["requests_per_s"] for n in SYSTEMS], color=["#999", "#555", "#2f5bea", "#7f9cf5"])
        ax.set_ylabel("requests/s (median)")
        ax.set_title(f"Throughput at {LATENCY_MS} ms backend latency")
        fig.tight_layout()
        fig.savefig(out / "throughput.png", dpi=110)
        plt.close(fig)
    loads = [(name, r[name]) for name in ("overhead", "llm_scale") if name in r]
    if loads:
        fig, axes = plt.subplots(1, len(loads), figsize=(5 * len(loads), 4), squeeze=False)
        for ax, (name, section) in zip(axes[0], loads):
            labels = {"baseline_b_aiokafka": ("B: aiokafka", "#555"), "baseline_c_faust": ("C: Faust floor", "#999"), "dlqapp_0pct_failures": ("dlqapp 0%", "#2f5bea"), "dlqapp_10pct_failures": ("dlqapp 10%", "#7f9cf5")}
            systems = [n for n in labels if n in section]
            medians = [section[n]["requests_per_s"]["median"] for n in systems]
            errors = [[m - section[n]["requests_per_s"]["min"] for n, m in zip(systems, medians)], [section[n]["requests_per_s"]["max"] - m for n, m in zip(systems, medians)]]
            ax.bar([labels[n][0] for n in systems], medians, yerr=errors, capsize=4, color=[labels[n][1] for n in systems])
            if "ceiling_per_s" in section:
                ax.axhline(section["ceiling_per_s"], color="#c33", linestyle="--", label=f"ceiling {section['ceiling_per_s']:.0f}/s")
                ax.legend()
            ax.set_ylabel("requests/s (median, min–max)")
            jitter = f" ± {section['jitter_ms']}" if "jitter_ms" in section else ""
            ax.set_title(f"{name}: {section['latency_ms']}{jitter} ms, {section['concurrency']} in flight")
        fig.tight_layout()
        fig.savefig(out / "per_request_cost.png", dpi=110)
        plt.close(fig)
    if samples:
        fig, ax = plt.subplots(figsize=(8, 4))
        for label, values in samples.items():
            if values:
                ordered = sorted(values)
                ax.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=label.replace("parked_scale/", "").replace("lateness/", ""))
        ax.set_xlabel("lateness (ms): attempt time − scheduled_time")
        ax.set_ylabel("share of retries")
        ax.set_title("Retry lateness CDF: idle, a burst, under a flood, and with many retries parked")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "lateness_cdf.png", dpi=110)
        plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one run each (keeps the harness from rotting)")
    parser.add_argument("--only", default="", help="comma-separated sections to run (default: all): " + ", ".join(SECTIONS))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--requests", type=int, default=0, help="requests per run of overhead and llm_scale (default 20,000 and 12,000; 100 with --quick)")
    parser.add_argument("--runs", type=int, default=0, help="runs of overhead and llm_scale (default 3; 1 with --quick)")
    parser.add_argument("--profile", action="store_true", help="record the first run of each system in overhead and llm_scale with py-spy (flame graphs into --out)")
    args = parser.parse_args()
    chosen = [s.strip() for s in args.only.split(",") if s.strip()] or [s for s in SECTIONS if not (args.quick and s in NOT_IN_QUICK)]
    unknown = set(chosen) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s) {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    tmp = Path(tempfile.mkdtemp(prefix="dlqapp-bench-"))
    broker = None
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        broker = LocalKafka(port=free_port(), data_dir=tmp / "kafka")
        env = broker.env()
        broker.run("start", env)
        bootstrap = broker.bootstrap
    bench = Bench(bootstrap, tmp, args.quick, Path(args.out) if args.profile else None, args.requests, args.runs)
    try:
        results: dict[str, Any] = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": f"{platform.machine()}, {os.cpu_count()} cores", "quick": args.quick}
        for section in chosen:
            print(section, flush=True)
            results[section] = getattr(bench, SECTIONS[section])()
        write_report(results, Path(args.out))
        print((Path(args.out) / "latest.md").read_text())
    finally:
        bench.close()
        if broker is not None:
            broker.run("stop", env, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


LATENESS_RUNS = int(os.environ.get("BENCH_LATENESS_RUNS", "5"))
LATENESS_SCENARIOS = ("idle", "paced_under_flood", "burst", "under_flood")
"""Probes paced or all at once (a burst), each alone or while a flood of fresh input drains."""
"""Runs of each lateness scenario (fresh worker each)."""

STATS_COST_LARGE = int(os.environ.get("BENCH_STATS_COST_REQUESTS", "1000000"))
"""Request states in the large `stats_cost` run (1M by default; seeding and restoring them take a few minutes)."""

SCALE_STEP_S = 60
SCALE_RATE = 150
SCALE_PARTITIONS = 12
SCALE_RUNS = 3
"""`scale_out`: each step's length, the steady input rate, the partitions the workers share, runs."""

SOAK_S = int(os.environ.get("SOAK_S", "1800"))
"""Length of the `soak` run (30 min by default)."""

PARTITION_COUNTS = (3, 12, 24)
"""DLQ_PARTITIONS values `partitions` compares (fresh worker and topics each run)."""

SECTIONS = {
    "throughput": "throughput",
    "overhead": "overhead",
    "llm_scale": "llm_scale",
    "latency": "paced_latency",
    "lateness": "lateness",
    "timer": "timer_tick",
    "parked_scale": "parked_scale",
    "recovery": "recovery",
    "stats_cost": "stats_cost",
    "flow_control": "flow_control",
    "partitions": "partition_cost",
    "scale_out": "scale_out",
    "soak": "soak",
    "tls_cost": "tls_cost",
    "demo": "demo",
}
"""Report section → Bench method, in the order a full run measures them."""
NOT_IN_QUICK = {"flow_control", "scale_out", "soak", "tls_cost", "demo"}
"""Left out of `--quick` unless named in `--only` (six and four workers: too slow for `make test`)."""


if __name__ == "__main__":
    random.seed(1)
    main()
