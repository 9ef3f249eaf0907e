"""`make bench`: dlqapp side by side with its baselines, measured in one run.

    python bench/run.py [--quick] [--out bench/results]

Starts what it needs (a private Kafka unless KAFKA_BOOTSTRAP is set, dlqapp-mock-llm at a
fixed 100 ms latency), warms the broker up (`Bench.warm_up`: a worker of each mode handles
2,000 requests, measured by nobody; not with --quick) and measures:

1. throughput (requests/s, median of runs) of baseline A (the source documents'
   synchronous consumer), baseline B (a raw aiokafka pass-through with the same
   concurrency) and dlqapp (openai backend against the mock, 0% and 10% failures);
   end-to-end p50/p99 under a paced load; the ratios dlqapp/A and dlqapp/B;
   per-request cost beside B and Faust's floor C, measured in turn in each of 3 runs:
   `overhead` (mock at 0 ms, 64 in flight: what the pipeline itself costs; also with 10%
   transient failures) and `llm_scale` (mock at 2000 ± 500 ms, 1024 in flight, ceiling
   512/s; C with aiohttp's client and with dlqapp's own), each with the
   CPU seconds per 1,000 requests of each process and of the mock (/proc/<pid>/stat),
   and resident memory with 4,096 calls in flight; the backend's HTTP client alone
   (`http_client`: aiohttp's beside dlqapp's own, CPU µs per call at the llm_scale load);
2. retry lateness per tier, idle and under an input flood;
3. timer scale: the timer's tick cost on a store of 1k, 100k and 1M parked retries, and a
   real worker grown to 1k, 100k and 1M parked retries: resident memory per parked retry
   and the lateness of fresh retries at each level;
4. recovery: kill -9 with many parked retries, time until processing again;
5. flow control: 2,000 requests against a provider limited to 600 rpm, with no flow
   control, adaptive concurrency alone, and DLQ_RATE_LIMITS: 429s, attempts, completion;
6. what traces cost (`trace_cost`): the overhead load with tracing off and with every span
   exported over OTLP/HTTP to a local endpoint, in turn in each of 3 runs.

`--only parked_scale,recovery` runs some sections (the report then holds only those).

Writes latest.json, latest.md, throughput.png, per_request_cost.png and lateness_cdf.png
into --out.
Timing lives here, never in pass/fail tests: `make test` runs only `--quick`.

This module is the command line only. bench/systems.py starts what is measured (dlqapp
workers, the baselines), bench/drivers.py feeds them and reads their outcomes,
bench/sections/ holds the sections (one module per family, each section a function of the
`Bench`), bench/report.py writes the report; bench/harness.py is the one bench module that
imports the helpers shared with tests/.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import LocalKafka, free_port  # noqa: E402
from bench.report import write_report  # noqa: E402
from bench.sections import (  # noqa: E402
    cost,
    fairness,
    guarantee,
    lateness,
    resilience,
    scaling,
    spring,
    standalone,
    stats_cost,
    throughput,
    timer,
    trace_cost,
)
from bench.systems import Bench  # noqa: E402

SECTIONS: dict[str, Callable[[Bench], dict[str, Any]]] = {
    "throughput": throughput.throughput,
    "overhead": cost.overhead,
    "llm_scale": cost.llm_scale,
    "http_client": cost.http_client,
    "latency": throughput.paced_latency,
    "lateness": lateness.lateness,
    "timer": timer.timer_tick,
    "parked_scale": timer.parked_scale,
    "recovery": resilience.recovery,
    "stats_cost": stats_cost.stats_cost,
    "flow_control": resilience.flow_control,
    "partitions": scaling.partition_cost,
    "scale_out": scaling.scale_out,
    "soak": standalone.soak,
    "tls_cost": standalone.tls_cost,
    "demo": standalone.demo,
    "guarantee": guarantee.guarantee_cost,
    "trace_cost": trace_cost.trace_cost,
    "fairness": fairness.fairness,
    "spring": spring.spring,
}
"""Report section → the function measuring it, in the order a full run measures them."""
NOT_IN_QUICK = {
    "flow_control",
    "scale_out",
    "soak",
    "tls_cost",
    "demo",
    "guarantee",
    "trace_cost",
    "fairness",
    "spring",
}
"""Left out of `--quick` unless named in `--only` (six and four workers: too slow for `make test`)."""


def parse_args() -> argparse.Namespace:
    """The command line; see the module's docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes, one run each (keeps the harness from rotting)"
    )
    parser.add_argument(
        "--only", default="", help="comma-separated sections to run (default: all): " + ", ".join(SECTIONS)
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument(
        "--requests",
        type=int,
        default=0,
        help="requests per run of overhead and llm_scale (default 20,000 and 12,000; 100 with --quick)",
    )
    parser.add_argument(
        "--runs", type=int, default=0, help="runs of overhead and llm_scale (default 3; 1 with --quick)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="record the first run of each system in overhead and llm_scale with py-spy (flame graphs into --out)",
    )
    args = parser.parse_args()
    args.sections = chosen_sections(args.only, args.quick)
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s) {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}")
    return args


def chosen_sections(only: str, quick: bool) -> list[str]:
    """The sections `--only` names, else all (but those NOT_IN_QUICK with --quick)."""
    return [s.strip() for s in only.split(",") if s.strip()] or [
        s for s in SECTIONS if not (quick and s in NOT_IN_QUICK)
    ]


def measure(bench: Bench, sections: list[str], quick: bool) -> dict[str, Any]:
    """Run `sections` in turn: the report's results, headed by when, where and whether quick."""
    results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "quick": quick,
    }
    if not quick:
        print("warm-up", flush=True)
        bench.warm_up()
    for section in sections:
        print(section, flush=True)
        results[section] = SECTIONS[section](bench)
    return results


def exit_on_sigterm() -> None:
    """A SIGTERM ends the bench as Ctrl-C does, through its cleanup: by default it ended the
    process at once and left its mock LLMs, workers and private Kafka running."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def main() -> None:
    """Parse the command line, start a private Kafka unless KAFKA_BOOTSTRAP is set, measure, report."""
    args = parse_args()
    exit_on_sigterm()
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
        results = measure(bench, args.sections, args.quick)
        write_report(results, Path(args.out))
        print((Path(args.out) / "latest.md").read_text())
    finally:
        bench.close()
        if broker is not None:
            broker.run("stop", env, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    random.seed(1)
    main()
