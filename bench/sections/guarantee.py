"""What DLQ_PROCESSING_GUARANTEE=exactly_once costs beside at_least_once, measured in turn
in every run: throughput and CPU per 1,000 requests with the mock at 0 ms and at 100 ms
(64 calls in flight), at the LLM scale (2000 ± 500 ms, 1,024 in flight), and end-to-end
latency (produce to committed result) at a steady 200 requests/s."""

from __future__ import annotations

from typing import Any

from bench.drivers import produce_paced, requests_for, wait_results
from bench.harness import MockLLM, read_topic, unique_ids
from bench.measure import percentile
from bench.sections.cost import LLM_CONCURRENCY, LLM_JITTER_MS, LLM_LATENCY_MS, ratios, side_by_side
from bench.systems import CONCURRENCY, Bench

MODES = ("at_least_once", "exactly_once")
PACED_RATE, PACED_SECONDS = 200, 20


def _lineup(bench: Bench, mock: MockLLM, concurrency: int) -> dict[str, Any]:
    return {
        mode: (lambda mode=mode: bench.start_dlqapp(mock, concurrency, DLQ_PROCESSING_GUARANTEE=mode), mock)
        for mode in MODES
    }


def _compare(bench: Bench, name: str, mock_args: list[str], concurrency: int, count: int, runs: int) -> dict[str, Any]:
    mock = MockLLM(bench.tmp, args=mock_args).start()
    try:
        out = side_by_side(bench, name, _lineup(bench, mock, concurrency), count, runs)
    finally:
        mock.stop()
    out["ratio_exactly_once_to_at_least_once"] = ratios(out, "exactly_once", "at_least_once")
    return out


def _paced(bench: Bench, mode: str, rate: int, seconds: int) -> dict[str, Any]:
    mock = MockLLM(bench.tmp, args=["--latency-ms", "100", "--jitter-ms", "20", "--seed", "5"]).start()
    system = bench.start_dlqapp(mock, CONCURRENCY, DLQ_PROCESSING_GUARANTEE=mode)
    try:
        ids = unique_ids("g", rate * seconds)
        produce_paced(bench.bootstrap, system.input, requests_for(ids), rate)
        results = wait_results(bench.bootstrap, system.results[0], ids, timeout=300, alive=system.alive)
        inputs = {
            r.key.decode(): r.timestamp
            for r in read_topic(bench.bootstrap, system.input, lambda rs: len(rs) >= len(ids), 60)
        }
        e2e = [r.timestamp - inputs[r.key.decode()] for r in results]
    finally:
        system.stop()
        mock.stop()
    return {"rate_per_s": rate, "e2e_p50_ms": percentile(e2e, 0.5), "e2e_p99_ms": percentile(e2e, 0.99)}


def guarantee_cost(bench: Bench) -> dict[str, Any]:
    """Both guarantees side by side (module doc)."""
    quick = bench.quick
    count, runs = (100, 1) if quick else (10_000, 3)
    out: dict[str, Any] = {
        "latency_0ms": _compare(bench, "guarantee_0ms", ["--latency-ms", "0"], CONCURRENCY, count, runs),
        "latency_100ms": _compare(
            bench,
            "guarantee_100ms",
            ["--latency-ms", "100", "--jitter-ms", "20", "--seed", "5"],
            CONCURRENCY,
            count,
            runs,
        ),
        "llm_scale": _compare(
            bench,
            "guarantee_llm",
            ["--latency-ms", str(LLM_LATENCY_MS), "--jitter-ms", str(LLM_JITTER_MS), "--seed", "5"],
            LLM_CONCURRENCY,
            100 if quick else 12_000,
            runs,
        ),
    }
    out["llm_scale"]["ceiling_per_s"] = LLM_CONCURRENCY / (LLM_LATENCY_MS / 1000)
    out["llm_scale"]["exactly_once_to_ceiling"] = (
        out["llm_scale"]["exactly_once"]["requests_per_s"]["median"] / out["llm_scale"]["ceiling_per_s"]
    )
    rate, seconds = (50, 2) if quick else (PACED_RATE, PACED_SECONDS)
    out["paced"] = {mode: _paced(bench, mode, rate, seconds) for mode in MODES}
    for mode, figures in out["paced"].items():
        print(f"  {mode} at {rate}/s: p50 {figures['e2e_p50_ms']} ms, p99 {figures['e2e_p99_ms']} ms", flush=True)
    return out
