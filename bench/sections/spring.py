"""Retries beside Spring Kafka's `@RetryableTopic` (bench/spring/, Spring Boot 4.0, its
defaults): the lateness of every retry (its start minus its due time) of 300 requests that
fail three times, delays 1, 2 and 4 s, a 100 ms call per attempt, in three scenarios (idle:
50 requests/s; burst: all at once; under a flood: a burst, then 20,000 fresh requests while
the retries wait). Each system runs on fresh topics of 12 partitions, the two in turn within
every run; 3 runs, each run's p99 per retry, median and range.

Spring gets a listener thread per partition on its input and on each retry topic (its
calls block a thread; dlqapp's are asynchronous, 64 in flight). Its lateness is the
listener's start minus the `retry_topic-backoff-timestamp` Spring wrote into the record;
dlqapp's is `at - scheduled` of each attempt in the result's history.

Written to bench/results/spring.json and spring.md (a run of this section alone)."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.drivers import make_topics, produce_in_batches, produce_paced, requests_for, requests_with_plan
from bench.harness import produce, unique, unique_ids, wait_until
from bench.measure import load_average, percentile, spread
from bench.sections.lateness import probe_lateness
from bench.systems import LATENCY_MS, ROOT, Bench

SPRING_DIR = ROOT / "bench" / "spring"
JAR = SPRING_DIR / "target" / "spring-retry-bench.jar"
PARTITIONS = 12
DELAYS = ("1s", "2s", "4s")
"""dlqapp's tiers; Spring's: 1 s, doubled twice (`@BackOff(delay = 1000, multiplier = 2.0)`)."""
PROBES_PER_S = 50
SCENARIOS = ("idle", "burst", "under_flood")
SYSTEMS = ("dlqapp", "spring")


def build_jar() -> Path:
    """The Spring app's jar, built with Maven when missing or older than its sources."""
    sources = [SPRING_DIR / "pom.xml", *(SPRING_DIR / "src").rglob("*")]
    newest = max(p.stat().st_mtime for p in sources if p.is_file())
    if not JAR.exists() or JAR.stat().st_mtime < newest:
        subprocess.run(["mvn", "-q", "-B", "-f", str(SPRING_DIR / "pom.xml"), "package", "-DskipTests"], check=True)
    return JAR


class SpringApp:
    """The Spring app on `input` (which it reads with a fresh group), and the lateness of each
    attempt it reports, by request id and retry number (0: the first attempt)."""

    def __init__(self, bootstrap: str, input_topic: str, log: Path) -> None:
        self.attempts: dict[str, dict[int, float]] = {}
        self._lock = threading.Lock()
        command = [
            "java",
            "-jar",
            str(build_jar()),
            f"--spring.kafka.bootstrap-servers={bootstrap}",
            f"--bench.input={input_topic}",
            f"--bench.group={unique('spring')}",
            f"--bench.partitions={PARTITIONS}",
            f"--bench.latency-ms={LATENCY_MS}",
        ]
        self._log = open(log, "ab")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            parts = line.split()
            if len(parts) == 4 and parts[0] == "BENCH":
                with self._lock:
                    self.attempts.setdefault(parts[1], {})[int(parts[2])] = float(parts[3])

    def retries_seen(self, ids: list[str], retries: int) -> bool:
        """Whether every one of `ids` was attempted `retries` times after its first attempt."""
        with self._lock:
            return all(retries in self.attempts.get(rid, {}) for rid in ids)

    def lateness(self, ids: list[str]) -> dict[str, list[float]]:
        """Lateness (ms) per retry number ("1", "2", "3") of `ids`."""
        with self._lock:
            return _per_retry({rid: self.attempts[rid] for rid in ids})

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        self._log.close()


def _per_retry(attempts: dict[str, dict[int, float]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for by_retry in attempts.values():
        for retry, lateness in by_retry.items():
            if retry:
                out.setdefault(str(retry), []).append(lateness)
    return out


def _drive(
    scenario: str,
    bootstrap: str,
    input_topic: str,
    ids: list[str],
    parked: Callable[[], bool],
    flood: int,
) -> None:
    """Produce `scenario`'s probes (and its flood once they have failed their first attempt)."""
    probes = requests_with_plan(ids, fail_times=3, error="unknown")
    if scenario == "idle":
        produce_paced(bootstrap, input_topic, probes, PROBES_PER_S)
        return
    produce(bootstrap, input_topic, probes)
    if scenario == "under_flood":
        wait_until(parked, 120, "probes failed once")
        produce_in_batches(bootstrap, input_topic, requests_for(unique_ids("flood", flood)), 5000)


def _spring_run(bench: Bench, scenario: str, probes: int, flood: int) -> dict[str, list[float]]:
    topics = make_topics(bench.bootstrap, unique("spring") + ".", PARTITIONS)
    app = SpringApp(bench.bootstrap, topics.input, bench.tmp / f"{topics.input}.log")
    try:
        warm = unique_ids("warm", 1)  # ready: a request has been through every retry topic
        produce(bench.bootstrap, topics.input, requests_with_plan(warm, fail_times=3, error="unknown"))
        wait_until(lambda: app.retries_seen(warm, 3), 180, lambda: f"Spring's warm-up request: {app.attempts}")
        ids = unique_ids("probe", probes)
        _drive(scenario, bench.bootstrap, topics.input, ids, lambda: app.retries_seen(ids, 0), flood)
        wait_until(lambda: app.retries_seen(ids, 3), 600, "Spring's probes' third retries")
        return app.lateness(ids)
    finally:
        app.stop()


def _dlqapp_run(bench: Bench, scenario: str, probes: int, flood: int) -> dict[str, list[float]]:
    worker = bench.simulated_worker(
        latency_ms=LATENCY_MS, DLQ_RETRY_DELAYS=",".join(DELAYS), DLQ_PARTITIONS=str(PARTITIONS)
    )
    worker.start()
    try:
        per_second = PROBES_PER_S if scenario == "idle" else None
        per_tier = probe_lateness(
            bench.bootstrap, worker, probes, flood if scenario == "under_flood" else 0, per_second, PARTITIONS
        )
        return {str(DELAYS.index(tier.removeprefix("retry-")) + 1): v for tier, v in per_tier.items()}
    finally:
        worker.kill()


def spring(bench: Bench) -> dict[str, Any]:
    """Retry lateness of dlqapp and Spring Kafka side by side (module doc)."""
    runs = 1 if bench.quick else 3
    probes = 10 if bench.quick else 300
    flood = 300 if bench.quick else 20_000
    run_of = {"dlqapp": _dlqapp_run, "spring": _spring_run}
    per_run: dict[str, dict[str, list[dict[str, float]]]] = {s: {x: [] for x in SYSTEMS} for s in SCENARIOS}
    loads: list[float] = []
    for run in range(runs):
        for scenario in SCENARIOS:
            for system in SYSTEMS:
                per_retry = run_of[system](bench, scenario, probes, flood)
                p99 = {retry: percentile(v, 0.99) for retry, v in sorted(per_retry.items())}
                per_run[scenario][system].append(p99)
                loads.append(load_average())
                print(f"  spring run {run + 1} {scenario} {system}: p99 per retry {p99}", flush=True)
    out: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": f"bench/run.py --only spring{' --quick' if bench.quick else ''} --out <scratch dir>",
        "delays": list(DELAYS),
        "partitions": PARTITIONS,
        "call_ms": LATENCY_MS,
        "probes": probes,
        "flood": flood,
        "runs": runs,
        "load_average": spread(loads),
    }
    for scenario, systems in per_run.items():
        out[scenario] = {
            system: {
                "p99_ms": {retry: spread([r[retry] for r in rows]) for retry in rows[0]},
                "per_run": rows,
            }
            for system, rows in systems.items()
        }
    if not bench.quick:
        results = ROOT / "bench" / "results"
        results.mkdir(parents=True, exist_ok=True)
        (results / "spring.json").write_text(json.dumps(out, indent=2) + "\n")
        (results / "spring.md").write_text(markdown(out))
    return out


def markdown(out: dict[str, Any]) -> str:
    """The comparison as a table: p99 of each retry, each system, each scenario."""

    def cell(figure: dict[str, float]) -> str:
        return f"{figure['median']:,.0f} ({figure['min']:,.0f}–{figure['max']:,.0f})"

    rows = []
    for scenario in SCENARIOS:
        for system in SYSTEMS:
            p99 = out[scenario][system]["p99_ms"]
            rows.append(f"| {scenario} | {system} | " + " | ".join(cell(p99[r]) for r in sorted(p99)) + " |")
    load = out["load_average"]
    return "\n".join(
        [
            "# Retries beside Spring Kafka",
            "",
            f"{out['when']}; `{out['command']}`; delays {', '.join(out['delays'])}; {out['probes']} requests "
            f"failing three times, a {out['call_ms']} ms call per attempt; flood {out['flood']:,}; "
            f"{out['partitions']} partitions; {out['runs']} runs, median (min–max) of each run's p99; "
            f"load average {load['median']:.1f} ({load['min']:.1f}–{load['max']:.1f}).",
            "",
            "| Scenario | System | p99 1st retry, ms | p99 2nd retry, ms | p99 3rd retry, ms |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
