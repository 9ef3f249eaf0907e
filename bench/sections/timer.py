"""3. Timer scale: the timer's tick on a store of many parked retries, and a real worker
grown to many parked retries (resident memory per parked retry, lateness of fresh ones)."""

from __future__ import annotations

import json
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.drivers import (
    metric_sum,
    parked_gauge,
    produce_in_batches,
    requests_for,
    requests_with_plan,
    wait_results,
)
from bench.harness import Worker, produce, request_bytes, unique_ids, wait_until
from bench.measure import percentile, process_memory
from bench.sections.lateness import PROBES_PER_S, lateness_summary, probe_lateness
from bench.systems import Bench

DUE_NOW, SCAN_BATCH = 100, 500
"""`timer`: entries due at the scan (the rest wait ten minutes and more), and the scan's batch."""


# -- the tick on its own ---------------------------------------------------------------


def _time_scans(scan: Callable[[], list[bytes]], times: int = 50) -> tuple[list[float], list[bytes]]:
    """Milliseconds of each of `times` scans, and what the last one returned."""
    durations = []
    for _ in range(times):
        started = time.perf_counter()
        keys = scan()
        durations.append((time.perf_counter() - started) * 1000)
    return durations, keys


def _tick_on_store(path: Path, size: int, churn: int, blob: bytes) -> dict[str, float]:
    """A RocksDB at `path` with `size` parked entries: its tick, disk per entry, and the tick
    after `churn` fired and deleted entries, from the first key and from the kept start."""
    from rocksdict import Options, Rdict

    from dlqapp.core.clock import now_ms
    from dlqapp.retries.keys import parked_key
    from dlqapp.retries.scan import scan_due

    db = Rdict(str(path), Options(raw_mode=True))
    now = now_ms()
    for i in range(size):
        due = now - 1000 + i if i < DUE_NOW else now + 600_000 + i  # `DUE_NOW` are due, the rest wait
        db.put(parked_key(due, f"req-{i:08d}"), blob)
    db.flush()
    ticks, keys = _time_scans(lambda: scan_due(db, now, start=None, fired={}, batch=SCAN_BATCH)[0])
    assert len(keys) == DUE_NOW
    disk = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    for i in range(churn):
        key = parked_key(now - 100_000 + i, f"fired-{i:08d}")
        db.put(key, blob)
        db.delete(key)
    naive, _ = _time_scans(lambda: scan_due(db, now, start=None, fired={}, batch=SCAN_BATCH)[0])
    _, start = scan_due(db, now, start=None, fired={}, batch=SCAN_BATCH)
    kept, keys = _time_scans(lambda: scan_due(db, now, start=start, fired={}, batch=SCAN_BATCH)[0])
    assert len(keys) == DUE_NOW
    db.close()
    shutil.rmtree(path, ignore_errors=True)
    return {
        "tick_ms_median": statistics.median(ticks),
        "tick_ms_p99": percentile(ticks, 0.99),
        "disk_bytes_per_entry": disk / size,
        "after_churn": churn,
        "tick_after_churn_from_first_key_ms": statistics.median(naive),
        "tick_after_churn_from_kept_start_ms": statistics.median(kept),
    }


def timer_tick(bench: Bench) -> dict[str, Any]:
    """The timer's own scan (dlqapp.retries.scan.scan_due) over a RocksDB with N parked entries,
    then after `churn` retries were fired and deleted (their tombstones sit at the head):
    scanning from the first key, as a naive timer would, and from the start the worker keeps."""
    from dlqapp.core.envelope import Envelope

    sizes = (1_000, 10_000) if bench.quick else (1_000, 100_000, 1_000_000)
    churn = 10_000 if bench.quick else 100_000
    out: dict[str, Any] = {}
    blob = Envelope("r" * 24, request_bytes("r" * 24), 0, {"topic": "input", "partition": 0, "offset": 0}).to_bytes()
    for size in sizes:
        out[str(size)] = _tick_on_store(bench.tmp / f"timer-{size}", size, churn, blob)
        print(f"  timer tick with {size} parked: {out[str(size)]}", flush=True)
    base = out[str(sizes[0])]["tick_ms_median"]
    for size in sizes:
        out[str(size)]["tick_ratio_to_1k"] = out[str(size)]["tick_ms_median"] / base
    return out


# -- a worker holding many parked retries ----------------------------------------------


def _warm_up(bench: Bench, worker: Worker, probes: int) -> None:
    """Run every code path once before the empty worker's memory is read."""
    probe_lateness(bench.bootstrap, worker, probes)
    warm = unique_ids("warm", 1000)
    produce(bench.bootstrap, worker.topic("input"), requests_for(warm))
    wait_results(bench.bootstrap, worker.topic("results"), warm, timeout=300)


def _park(bench: Bench, worker: Worker, level: int, parked: int) -> float:
    """Grow `worker` from `parked` to `level` parked retries (due in a day); seconds it took
    until the gauge showed them. Then wait until it has caught up with its input."""
    loading = time.monotonic()
    ids = unique_ids(f"park{level}", level - parked)
    produce_in_batches(
        bench.bootstrap,
        worker.topic("input"),
        requests_with_plan(ids, fail_times=1, error="rate_limited", retry_after=86_400),
    )
    wait_until(lambda: parked_gauge(worker) >= level, 3600, f"{level} parked retries", interval=2.0)
    load_s = time.monotonic() - loading
    # The tier agents still read the retries' tier messages: measure a settled worker.
    wait_until(lambda: metric_sum(worker, "dlqapp_consumer_lag") == 0, 600, "the worker to catch up", interval=1.0)
    return load_s


def _lateness_figures(per_tier: dict[str, list[float]]) -> dict[str, Any]:
    """Lateness of fresh retries over all tiers (p50, p99, max, min), then per tier."""
    all_tiers = [x for v in per_tier.values() for x in v]
    return {
        "lateness_p50_ms": percentile(all_tiers, 0.5),
        "lateness_p99_ms": percentile(all_tiers, 0.99),
        "lateness_max_ms": max(all_tiers),
        "lateness_min_ms": min(all_tiers),
        "per_tier": lateness_summary(per_tier),
    }


def parked_scale(bench: Bench) -> dict[str, Any]:
    """One real worker grown to 1k, 100k and 1M parked retries (due in a day): at each
    level, resident memory per parked retry and the lateness of fresh retries."""
    levels = (100, 1_000) if bench.quick else (1_000, 100_000, 1_000_000)
    probes = 10 if bench.quick else 200
    worker = bench.simulated_worker(latency_ms=1, DLQ_CONCURRENCY="256")
    worker.start()
    assert worker.process is not None
    try:
        _warm_up(bench, worker, probes)
        empty = process_memory(worker.process.pid)["rss_bytes"]
        out: dict[str, Any] = {"empty_worker_rss_bytes": empty}
        parked, previous_rss = 0, empty
        for level in levels:
            load_s = _park(bench, worker, level, parked)
            previous_level, parked = parked, level
            exact = worker.get("/retries/?limit=1")[1]["total"]
            memory = process_memory(worker.process.pid)
            per_tier = probe_lateness(bench.bootstrap, worker, probes, per_second=PROBES_PER_S)
            out[str(level)] = {
                "parked": exact,
                "load_s": round(load_s, 1),
                **memory,
                "rss_bytes_per_parked": (memory["rss_bytes"] - empty) / level,
                "rss_bytes_per_added_parked": (memory["rss_bytes"] - previous_rss) / (level - previous_level),
                **_lateness_figures(per_tier),
            }
            out[f"{level:,} parked_samples"] = [x for v in per_tier.values() for x in v]
            previous_rss = memory["rss_bytes"]
            print(
                f"  worker with {level} parked: "
                f"{json.dumps({k: v for k, v in out[str(level)].items() if k != 'per_tier'})}",
                flush=True,
            )
        base = out[str(levels[0])]["lateness_p99_ms"]
        for level in levels:
            out[str(level)]["lateness_p99_ratio_to_first"] = out[str(level)]["lateness_p99_ms"] / base if base else None
        return out
    finally:
        worker.kill()
