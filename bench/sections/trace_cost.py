"""`trace_cost`: what traces cost a worker. The same load (the mock answers at once, 64 calls in
flight: where a span's cost shows most) through a worker without OTEL_TRACES_EXPORTER and through
one exporting every attempt's span over OTLP/HTTP (protobuf) to a local endpoint, each measured
in turn in every run: requests/s and CPU s per 1,000 requests, and the spans the endpoint got.
Beside each, an attempt's span alone (`SPAN_LOOP`): CPU µs per attempt in a process that does
nothing else, a figure the machine's other load disturbs less than a worker's.

The endpoint (tests/otlp_sink.py, through bench/harness.py) runs in the bench's own process, so
its CPU is not the worker's; the SDK runs with its defaults (a batch every 5 s or 512 spans).
The requests carry no trace context, so each starts a trace of its own: a span of a continued
trace costs the same.

    .venv/bin/python bench/run.py --only trace_cost
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from bench.harness import MockLLM, OtlpSink
from bench.measure import spread
from bench.sections.cost import cost_run_repeated, ratios
from bench.systems import CONCURRENCY, Bench

SYSTEMS = ("tracing_off", "tracing_on")
SPANS_WAIT_S = 20.0
"""How long a run waits for the last batch of spans (the SDK sends one every 5 s at least)."""
SPAN_LOOP = """
import json, sys, time
from dlqapp.core.envelope import Attempt, Envelope
from dlqapp.core.errors import ErrorClass, Failure
from dlqapp.core.outcomes import RetryAt
from dlqapp.settings import Settings
from dlqapp.wiring.composition import tracing_of
from dlqapp.wiring.ports import span_exporters

settings = Settings.from_env()
tracing = tracing_of(settings, span_exporters(settings))
count = int(sys.argv[1])
outcome = RetryAt(0, 2, Failure(ErrorClass.SERVER_ERROR, "scripted server_error"))
called = Attempt(1, 1, "input", None, 5, "server_error", "scripted server_error")
began = time.process_time()
for i in range(count):
    envelope = Envelope(f"r{i}", b"{}", 0, {}, lineage={"traceparent": f"00-{i + 1:032x}-00f067aa0ba902b7-01"})
    span = tracing.attempt(envelope, tier="input", model=None)
    span.outcome(outcome, called)
    span.end()
tracing.flush(30)
print(json.dumps({"cpu_us_per_attempt": (time.process_time() - began) * 1e6 / count}))
"""
"""An attempt's span alone: `count` spans begun, told their outcome, ended and exported (the
queue holds them all: none dropped), in a process of its own; its CPU time (the exporter's
thread included) per attempt."""
SPAN_LOOP_COUNT = 20_000


def span_cpu(env: dict[str, str], count: int) -> float:
    """CPU µs per attempt of SPAN_LOOP under `env` (tracing off or on)."""
    out = subprocess.run(
        [sys.executable, "-c", SPAN_LOOP, str(count)],
        env={**os.environ, **env, "OTEL_BSP_MAX_QUEUE_SIZE": str(count)},  # none dropped: each one exported
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["cpu_us_per_attempt"])


def _spans_arrived(sink: OtlpSink, before: int, expected: int) -> dict[str, float]:
    """Wait (the worker still running) until `expected` more spans arrived, or SPANS_WAIT_S; how many did."""
    deadline = time.monotonic() + SPANS_WAIT_S
    while len(sink.spans) - before < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    return {"spans_per_request": (len(sink.spans) - before) / expected}


def trace_cost(bench: Bench) -> dict[str, Any]:
    """Tracing off beside tracing on, in turn in every run (module doc)."""
    count, runs = (100, 1) if bench.quick else (10_000, 3)
    count, runs = bench.requests or count, bench.runs or runs
    mock = MockLLM(bench.tmp, args=["--latency-ms", "0"]).start()
    sink = OtlpSink().start()
    envs = {
        "tracing_off": {"OTEL_TRACES_EXPORTER": "none"},
        "tracing_on": {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
            "OTEL_SERVICE_NAME": "bench",
        },
    }
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in SYSTEMS}
    try:
        for run in range(runs):
            for name in SYSTEMS:
                env, before = envs[name], len(sink.spans)
                row = cost_run_repeated(
                    bench,
                    lambda env=env: bench.start_dlqapp(mock, CONCURRENCY, **env),
                    mock,
                    count,
                    profile=f"trace_cost-{name}" if run == 0 else None,
                    before_stop=(lambda before=before: _spans_arrived(sink, before, count))
                    if name == "tracing_on"
                    else None,
                )
                row["span_cpu_us"] = span_cpu(env, 1000 if bench.quick else SPAN_LOOP_COUNT)
                rows[name].append(row)
                spans = f", {row['spans_per_request']:.3f} spans per request" if "spans_per_request" in row else ""
                print(
                    f"  run {run + 1} {name}: {row['requests_per_s']:.1f} req/s, {row['cpu_s_per_1k']:.2f} CPU s/1k"
                    f"{spans}; an attempt alone: {row['span_cpu_us']:.1f} CPU µs",
                    flush=True,
                )
    finally:
        mock.stop()
        sink.stop()
    out: dict[str, Any] = {"requests": count, "runs": runs, "concurrency": CONCURRENCY, "latency_ms": 0}
    for name, measured in rows.items():
        out[name] = {
            "runs": measured,
            **{
                figure: spread([row[figure] for row in measured])
                for figure in ("requests_per_s", "cpu_s_per_1k", "span_cpu_us")
            },
        }
    on, off = out["tracing_on"], out["tracing_off"]
    on["spans_per_request"] = spread([row["spans_per_request"] for row in rows["tracing_on"]])
    out["ratio_on_to_off"] = ratios(out, "tracing_on", "tracing_off")
    out["cpu_ratio_on_to_off"] = on["cpu_s_per_1k"]["median"] / off["cpu_s_per_1k"]["median"]
    out["extra_cpu_ms_per_request"] = on["cpu_s_per_1k"]["median"] - off["cpu_s_per_1k"]["median"]  # s per 1k = ms
    out["span_cpu_us_on_minus_off"] = on["span_cpu_us"]["median"] - off["span_cpu_us"]["median"]
    return out


def markdown(cost: dict[str, Any]) -> list[str]:
    """The section's table in latest.md."""
    lines = [
        f"## trace_cost: tracing off beside OTLP/HTTP export of every span, mock at 0 ms, {cost['concurrency']} in "
        f"flight, {cost['requests']:,} requests per run, {cost['runs']} runs, median (min–max)",
        "",
        "| Tracing | Requests/s | CPU s per 1,000 requests | Spans received per request | CPU µs per attempt alone |",
        "|---|---|---|---|---|",
    ]
    for name in SYSTEMS:
        r, c, alone = (cost[name][figure] for figure in ("requests_per_s", "cpu_s_per_1k", "span_cpu_us"))
        spans = cost[name].get("spans_per_request")
        received = f"{spans['median']:.3f}" if spans else "–"
        lines.append(
            f"| {name.removeprefix('tracing_')} | {r['median']:.0f} ({r['min']:.0f}–{r['max']:.0f}) | "
            f"{c['median']:.2f} ({c['min']:.2f}–{c['max']:.2f}) | {received} | "
            f"{alone['median']:.1f} ({alone['min']:.1f}–{alone['max']:.1f}) |"
        )
    ratio = cost["ratio_on_to_off"]
    lines += [
        "",
        f"on / off: requests/s **{ratio['of_medians']:.2f}×** (per run: "
        f"{', '.join(f'{x:.2f}' for x in ratio['per_run'])}), CPU per request **{cost['cpu_ratio_on_to_off']:.2f}×** "
        f"({cost['extra_cpu_ms_per_request']:+.3f} ms per request); an attempt's span alone: "
        f"{cost['span_cpu_us_on_minus_off']:+.1f} µs of CPU",
    ]
    return lines
