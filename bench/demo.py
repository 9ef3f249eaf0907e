"""`demo`: the README demo as a new user runs it, measured (issue 30).

A worker with every default (the simulated backend, tiers 1s, 10s, 1m, the breaker on),
then `faust -A dlqapp generate --count 300 --rate 100 --fail-share 0.1`; once every
request has an outcome: the real retry lateness per tier (attempt start minus
`scheduled_time`, from the worker's own samples), the breaker's moves, and whether the
counts equal the topics. Fresh topics and worker each run.

    .venv/bin/python bench/run.py --only demo
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path
from typing import Any

from bench.harness import FAUST, Worker, read_topic, unique, wait_until
from bench.measure import spread

COUNT = 300


def demo_once(bootstrap: str, tmp: Path) -> dict[str, Any]:
    worker = Worker(
        bootstrap,
        tmp,
        name=unique("demo"),
        env_extra={"DLQ_BREAKER": "true", "DLQ_PARTITIONS": "12", "DLQ_RETRY_DELAYS": "1s,10s,1m"},
    )
    worker.start()
    try:
        env = {**worker.env(), "DLQ_WEB_URL": worker.url}
        run = subprocess.run(
            [
                str(FAUST),
                "-A",
                "dlqapp",
                "generate",
                "--count",
                str(COUNT),
                "--rate",
                "100",
                "--fail-share",
                "0.1",
                "--json",
            ],
            env=env,
            cwd=worker.tmp,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr
        prefix = json.loads(run.stdout)["prefix"]
        records = read_topic(
            bootstrap, [worker.topic("results"), worker.topic("dlq")], lambda r: len(r) >= COUNT, 600, partitions=12
        )
        results = {r.key for r in records if r.topic.endswith("results")}
        dead = {r.key for r in records if r.topic.endswith("dlq") and r.value}

        def agree() -> dict[str, Any] | None:
            stats = worker.get("/dlq/stats/")[1]
            return (
                stats
                if (stats["received"], stats["succeeded"], stats["dlq_size"]) == (COUNT, len(results), len(dead))
                else None
            )

        try:
            stats, counts_agree = wait_until(agree, 30, "the counts to equal the topics"), True
        except AssertionError:
            stats, counts_agree = worker.get("/dlq/stats/")[1], False
        health = worker.get("/health/")[1]
        lateness = health["workers"][0]["retry_lateness_by_tier"]
        breaker = next(iter(stats["breaker"].values()))
        return {
            "prefix": prefix,
            "results": len(results),
            "dead_letters": len(dead),
            "counts_agree": counts_agree,
            "breaker_moves": sum(breaker["moves"].values()),
            "lateness_by_tier": lateness,
        }
    finally:
        worker.stop()


def run_demo(bootstrap: str, tmp: Path, runs: int = 3) -> dict[str, Any]:
    rows = [demo_once(bootstrap, tmp) for _ in range(runs)]
    tiers = sorted(
        {tier for row in rows for tier in row["lateness_by_tier"]},
        key=lambda t: rows[0]["lateness_by_tier"].get(t, {}).get("count", 0),
        reverse=True,
    )
    per_tier = {}
    for tier in tiers:
        samples = [row["lateness_by_tier"][tier] for row in rows if tier in row["lateness_by_tier"]]
        per_tier[tier] = {
            figure: spread([s[figure] for s in samples]) for figure in ("count", "p50_ms", "p99_ms", "max_ms")
        }
    return {
        "runs": rows,
        "lateness_by_tier": per_tier,
        "breaker_moves": spread([row["breaker_moves"] for row in rows]),
        "counts_agree": all(row["counts_agree"] for row in rows),
        "dead_letters": statistics.median(row["dead_letters"] for row in rows),
    }


def markdown(demo: dict[str, Any]) -> list[str]:
    lines = [
        f"### The README demo ({COUNT} requests at 100/s, 10 % failing for good), {len(demo['runs'])} runs, median "
        "(min–max)",
        "",
        f"Breaker moves: {demo['breaker_moves']['median']:g} (max {demo['breaker_moves']['max']:g}); counts equal "
        f"the topics in every run: {demo['counts_agree']}.",
        "",
        "| tier | retries | lateness p50 (ms) | p99 (ms) | max (ms) |",
        "|---|---|---|---|---|",
    ]
    for tier, f in demo["lateness_by_tier"].items():
        lines.append(
            f"| {tier} | {f['count']['median']:g} | {f['p50_ms']['median']:g} "
            f"({f['p50_ms']['min']:g}–{f['p50_ms']['max']:g}) | "
            f"{f['p99_ms']['median']:g} ({f['p99_ms']['min']:g}–{f['p99_ms']['max']:g}) | {f['max_ms']['median']:g} "
            f"({f['max_ms']['min']:g}–{f['max_ms']['max']:g}) |"
        )
    return lines
