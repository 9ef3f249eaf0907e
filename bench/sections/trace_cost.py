"""`trace_cost`: what traces cost a worker. The same load (the mock answers at once, 64 calls in
flight: where a span's cost shows most) through a worker without OTEL_TRACES_EXPORTER and through
one exporting every attempt's span over OTLP/HTTP (protobuf) to a local endpoint, each measured
in turn in every run: requests/s and CPU s per 1,000 requests, and the spans the endpoint got.

The endpoint is tests/otlp_sink.py (through bench/harness.py) in the bench's own process (its CPU is not the worker's);
the SDK runs with its defaults (a batch every 5 s or 512 spans). The requests carry no trace
context, so each starts a trace of its own: a span of a continued trace costs the same.

    .venv/bin/python bench/run.py --only trace_cost
"""

from __future__ import annotations

import time
from typing import Any

from bench.harness import MockLLM, OtlpSink
from bench.measure import spread
from bench.sections.cost import cost_run_repeated, ratios
from bench.systems import CONCURRENCY, Bench

SYSTEMS = ("tracing_off", "tracing_on")
SPANS_WAIT_S = 20.0
"""How long a run waits for the last batch of spans (the SDK sends one every 5 s at least)."""


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
    traced = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
        "OTEL_SERVICE_NAME": "bench",
    }
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in SYSTEMS}
    try:
        for run in range(runs):
            for name in SYSTEMS:
                env = traced if name == "tracing_on" else {"OTEL_TRACES_EXPORTER": "none"}
                before = len(sink.spans)
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
                rows[name].append(row)
                print(
                    f"  run {run + 1} {name}: {row['requests_per_s']:.1f} req/s, {row['cpu_s_per_1k']:.2f} CPU s/1k"
                    + (f", {row['spans_per_request']:.3f} spans per request" if "spans_per_request" in row else ""),
                    flush=True,
                )
    finally:
        mock.stop()
        sink.stop()
    out: dict[str, Any] = {"requests": count, "runs": runs, "concurrency": CONCURRENCY, "latency_ms": 0}
    for name, measured in rows.items():
        out[name] = {
            "runs": measured,
            **{figure: spread([row[figure] for row in measured]) for figure in ("requests_per_s", "cpu_s_per_1k")},
        }
    out["tracing_on"]["spans_per_request"] = spread([row["spans_per_request"] for row in rows["tracing_on"]])
    out["ratio_on_to_off"] = ratios(out, "tracing_on", "tracing_off")
    out["cpu_ratio_on_to_off"] = (
        out["tracing_on"]["cpu_s_per_1k"]["median"] / out["tracing_off"]["cpu_s_per_1k"]["median"]
    )
    out["extra_cpu_ms_per_request"] = (
        out["tracing_on"]["cpu_s_per_1k"]["median"] - out["tracing_off"]["cpu_s_per_1k"]["median"]
    )  # s per 1,000 requests = ms per request
    return out


def markdown(cost: dict[str, Any]) -> list[str]:
    """The section's table in latest.md."""
    lines = [
        f"## trace_cost: tracing off beside OTLP/HTTP export of every span, mock at 0 ms, {cost['concurrency']} in "
        f"flight, {cost['requests']:,} requests per run, {len(cost['tracing_on']['runs'])} runs, median (min–max)",
        "",
        "| Tracing | Requests/s | CPU s per 1,000 requests | Spans received per request |",
        "|---|---|---|---|",
    ]
    for name in SYSTEMS:
        r, c = cost[name]["requests_per_s"], cost[name]["cpu_s_per_1k"]
        spans = cost[name].get("spans_per_request")
        lines.append(
            f"| {name.removeprefix('tracing_')} | {r['median']:.0f} ({r['min']:.0f}–{r['max']:.0f}) | "
            f"{c['median']:.2f} ({c['min']:.2f}–{c['max']:.2f}) | " + (f"{spans['median']:.3f} |" if spans else "– |")
        )
    ratio = cost["ratio_on_to_off"]
    lines += [
        "",
        f"on / off: requests/s **{ratio['of_medians']:.2f}×** (per run: "
        f"{', '.join(f'{x:.2f}' for x in ratio['per_run'])}), CPU per request **{cost['cpu_ratio_on_to_off']:.2f}×** "
        f"({cost['extra_cpu_ms_per_request']:+.3f} ms of CPU per request)",
    ]
    return lines
