"""Scaling: what more partitions cost one worker, and workers joining under a steady load."""

from __future__ import annotations

import threading
import time
from itertools import pairwise
from typing import Any

from bench.drivers import LoopLagSampler, produce_paced, wait_results
from bench.harness import Record, Worker, read_topic, request_bytes, unique, unique_ids
from bench.measure import cpu_seconds, percentile, process_memory, spread
from bench.sections.resilience import FLOW_LATENCY_MS
from bench.systems import Bench

PARTITION_COUNTS = (3, 12, 24)
"""DLQ_PARTITIONS values `partitions` compares (fresh worker and topics each run)."""

SCALE_STEP_S = 60
SCALE_RATE = 150
SCALE_PARTITIONS = 12
SCALE_RUNS = 3
"""`scale_out`: each step's length, the steady input rate, the partitions the workers share, runs."""
SCALE_STEPS = ("1 worker", "2 workers", "4 workers")


# -- partitions ------------------------------------------------------------------------


def _partitions_once(bench: Bench, count: int, idle_s: int, samples: dict[str, list[float]]) -> None:
    """A fresh worker on `count` partitions: add its start time, idle CPU and memory, worst loop lag to `samples`."""
    worker = bench.simulated_worker(latency_ms=1, DLQ_PARTITIONS=str(count))
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


def partition_cost(bench: Bench) -> dict[str, Any]:
    """What more partitions cost one worker: start to ready, resident memory and CPU while
    idle (the timer and the sweeps visit every partition), the event loop's worst lag."""
    counts = (3, 12) if bench.quick else PARTITION_COUNTS
    runs = 1 if bench.quick else 3
    idle_s = 3 if bench.quick else 15
    out: dict[str, Any] = {}
    for count in counts:
        samples: dict[str, list[float]] = {"start_to_ready_s": [], "rss_mib": [], "idle_cpu_pct": [], "loop_lag_ms": []}
        for _ in range(runs):
            _partitions_once(bench, count, idle_s, samples)
        out[str(count)] = {name: spread(values) for name, values in samples.items()}
        print(f"  partitions {count}: {out[str(count)]}", flush=True)
    return out


# -- workers joining -------------------------------------------------------------------


def scale_out(bench: Bench) -> dict[str, Any]:
    """Workers joining under a steady load: 1, then 2, then 4, each step `SCALE_STEP_S`
    long, requests at `SCALE_RATE` per second on the simulated backend at 1 s latency
    (one worker's ceiling: DLQ_CONCURRENCY per second), 10% failing once (a retry each,
    1 s later). Per step: results per second, request latency (input written → result
    written), retry lateness (attempt − due time), the longest pause between results; at
    the end, every request's outcome. Median and range of `SCALE_RUNS` runs."""
    step_s = 10 if bench.quick else SCALE_STEP_S
    rate = 30 if bench.quick else SCALE_RATE
    runs = [_scale_once(bench, step_s, rate) for _ in range(1 if bench.quick else SCALE_RUNS)]
    steps = {
        label: {name: spread([run["steps"][label][name] for run in runs]) for name in runs[0]["steps"][label]}
        for label in runs[0]["steps"]
    }
    out = {
        "rate_per_s": rate,
        "step_s": step_s,
        "partitions": SCALE_PARTITIONS,
        "requests": runs[0]["requests"],
        "runs": len(runs),
        "lost": sum(run["lost"] for run in runs),
        "steps": steps,
    }
    print(f"  scale_out: {out}", flush=True)
    return out


def _scale_requests(ids: list[str]) -> list[tuple[bytes, bytes]]:
    """The requests of one run: every tenth fails once (a retryable error of its own)."""
    failing = set(ids[::10])
    return [
        (
            rid.encode(),
            request_bytes(
                rid, **({"metadata": {"simulate": {"fail_times": 1, "error": "unknown"}}} if rid in failing else {})
            ),
        )
        for rid in ids
    ]


def _join(bench: Bench, first: Worker, workers: list[Worker], step_s: int, joins_ms: list[float]) -> None:
    """After each step, one more worker and then two more join `first`'s group (started, not awaited)."""
    for joining in (1, 2):
        time.sleep(step_s)  # each step runs for a fixed time: the measurement itself
        joins_ms.append(time.time() * 1000)
        for _ in range(joining):
            worker = Worker(
                bench.bootstrap,
                bench.tmp,
                app_id=first.app_id,
                prefix=first.prefix,
                name=unique("bw"),
                env_extra=first.env_extra,
            )
            worker.start(wait=False)
            workers.append(worker)


def _step_figures(outcomes: list[Record], sent: dict[str, int], low: float, high: float) -> dict[str, float]:
    """Figures of the outcomes written in [low, high) ms."""
    inside = sorted(r.timestamp for r in outcomes if low <= r.timestamp < high)
    latency = [
        (r.timestamp - sent[r.key.decode()]) / 1000
        for r in outcomes
        if low <= r.timestamp < high and r.key.decode() in sent
    ]
    gaps = [b - a for a, b in pairwise(inside)]
    retried = [r for r in outcomes if low <= r.timestamp < high and r.topic.endswith("results")]
    late = [a["at"] - a["scheduled"] for r in retried for a in (r.json.get("history") or [])[1:] if a.get("scheduled")]
    return {
        "results_per_s": round(len(inside) / ((high - low) / 1000), 1),
        "latency_p50_s": round(percentile(latency, 0.5) or 0, 2),
        "latency_p99_s": round(percentile(latency, 0.99) or 0, 2),
        "longest_pause_s": round(max(gaps, default=0) / 1000, 2),
        "retry_lateness_p50_ms": round(percentile(late, 0.5) or 0),
        "retry_lateness_p99_ms": round(percentile(late, 0.99) or 0),
    }


def _scale_once(bench: Bench, step_s: int, rate: int) -> dict[str, Any]:
    """One run: a worker, then 2 and 4, under `rate` requests/s; figures per step, requests lost."""
    env = {"DLQ_PARTITIONS": str(SCALE_PARTITIONS), "DLQ_RETRY_DELAYS": "1s,10s,60s"}
    first = bench.simulated_worker(latency_ms=FLOW_LATENCY_MS, **env)
    workers = [first]
    first.start()
    ids = unique_ids("scale", rate * step_s * 3)
    feeder = threading.Thread(
        target=produce_paced, args=(bench.bootstrap, first.topic("input"), _scale_requests(ids), rate), daemon=True
    )
    try:
        started_ms = time.time() * 1000
        feeder.start()
        joins_ms: list[float] = []
        _join(bench, first, workers, step_s, joins_ms)
        feeder.join()
        outcomes = wait_results(
            bench.bootstrap, [first.topic("results"), first.topic("dlq")], ids, timeout=600, partitions=SCALE_PARTITIONS
        )
        sent = {
            r.key.decode(): r.timestamp
            for r in read_topic(
                bench.bootstrap,
                first.topic("input"),
                lambda got: len(got) >= len(ids),
                120,
                partitions=SCALE_PARTITIONS,
            )
        }
    finally:
        for worker in workers:
            worker.stop()
    bounds = [started_ms, *joins_ms, max(r.timestamp for r in outcomes) + 1]
    steps = {
        label: _step_figures(outcomes, sent, bounds[index], bounds[index + 1])
        for index, label in enumerate(SCALE_STEPS)
    }
    lost = len(set(ids) - {r.key.decode() for r in outcomes})
    print(f"  scale_out run: lost {lost}, {steps}", flush=True)
    return {"requests": len(ids), "lost": lost, "steps": steps}
