"""`soak`: steady state under a flaky provider, and one outage in the middle (issue 34).

One worker with default settings but tiers 1s,2s,3s, on the `openai` backend against
`dlqapp-mock-llm` (20 ± 10 ms): a steady input rate; 20 % of requests fail their first
call with a 503 (the retry succeeds), 1 % fail every call with a 401 (they reach the DLQ);
halfway through, the provider is down for `outage_s`. Every `sample_s` one row: rates in
and out, consumer lag, retry lateness p99 over that interval, breaker state and moves,
requests held, RSS and CPU. At the end every request must have an outcome.

    .venv/bin/python bench/run.py --only soak          # 30 minutes (make bench)
    SOAK_S=300 .venv/bin/python bench/run.py --only soak
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from bench.harness import MockLLM, Worker, keys_seen, read_topic, request_bytes, unique
from bench.measure import cpu_seconds, process_memory


@dataclass(frozen=True)
class SoakConfig:
    duration_s: int = 1800
    rate_per_s: int = 150
    sample_s: int = 15
    outage_s: int = 20
    fail_once: str = "503=0.2"
    fail_always: str = "401=0.01"
    latency_ms: int = 20
    jitter_ms: int = 10
    partitions: int = 12
    settle_s: int = 60
    """After the outage, how long the backlog it left may take to drain before 'steady' again."""

    @property
    def outage_at_s(self) -> float:
        return self.duration_s / 2


class PacedProducer(threading.Thread):
    """Sends `rate_per_s` requests a second, in tenths of a second, until stopped."""

    def __init__(self, bootstrap: str, topic: str, rate_per_s: int, run_id: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.rate, self.run_id = bootstrap, topic, rate_per_s, run_id
        self.sent = 0
        self.ids: list[str] = []
        self._done = threading.Event()
        self.error: BaseException | None = None

    def stop(self) -> None:
        self._done.set()
        self.join()
        if self.error is not None:
            raise self.error

    def run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:
            self.error = exc

    async def _produce(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=5)
        await producer.start()
        try:
            started = time.monotonic()
            while not self._done.is_set():
                due = int((time.monotonic() - started) * self.rate)
                futures = []
                while self.sent < due:
                    rid = f"{self.run_id}-{self.sent}"
                    futures.append(await producer.send(self.topic, key=rid.encode(), value=request_bytes(rid)))
                    self.ids.append(rid)
                    self.sent += 1
                await asyncio.gather(*futures)
                await asyncio.sleep(0.1)
        finally:
            await producer.stop()


def sample(
    worker: Worker, config: SoakConfig, since: float, previous: dict[str, Any] | None, sent: int
) -> dict[str, Any]:
    """One row of the series."""
    stats = worker.get("/dlq/stats/")[1]
    health = worker.get(f"/health/?window={config.sample_s}s")[1]
    breaker = next(iter(stats["breaker"].values()))
    rss, cpu = process_memory(worker.process.pid)["rss_bytes"] / 2**20, cpu_seconds(worker.process.pid)
    now = time.monotonic()
    done = stats["succeeded"] + stats["dlq_size"]
    interval = now - previous["_at"] if previous else now - since
    late = health["total"].get("retry_lateness_p99_s")
    return {
        "t_s": round(now - since, 1),
        "in_per_s": round((sent - (previous["_sent"] if previous else 0)) / interval, 1),
        "out_per_s": round((done - (previous["_done"] if previous else 0)) / interval, 1),
        "consumer_lag": health["total"].get("consumer_lag", 0),
        "lateness_p99_ms": None if late is None else round(late * 1000, 1),
        "breaker": breaker["state"],
        "moves": sum(breaker["moves"].values()),
        "held": health["total"].get("held", 0),
        "rss_mib": round(rss, 1),
        "cpu_pct": round(100 * (cpu - (previous["_cpu"] if previous else 0)) / interval, 1),
        "_at": now,
        "_sent": sent,
        "_done": done,
        "_cpu": cpu,
    }


def run_soak(bootstrap: str, tmp: Path, config: SoakConfig) -> dict[str, Any]:
    """Run the soak; the series, the outcome check and the goals."""
    mock = MockLLM(
        tmp,
        args=[
            "--latency-ms",
            str(config.latency_ms),
            "--jitter-ms",
            str(config.jitter_ms),
            "--fail-once",
            config.fail_once,
            "--fail-always",
            config.fail_always,
        ],
    ).start()
    worker = Worker(
        bootstrap,
        tmp,
        name=unique("soak"),
        env_extra={
            "DLQ_INFERENCE": "openai",
            "DLQ_INFERENCE_URL": mock.api_url,
            "DLQ_RETRY_DELAYS": "1s,2s,3s",
            "DLQ_BREAKER": "true",
            "DLQ_PARTITIONS": str(config.partitions),
            "DLQ_LOG_LEVEL": "warning",
        },
    )
    try:
        worker.start()
        producer = PacedProducer(bootstrap, worker.topic("input"), config.rate_per_s, unique("soak"))
        since = time.monotonic()
        producer.start()
        rows: list[dict[str, Any]] = []
        outage = (config.outage_at_s, config.outage_at_s + config.outage_s)
        outage_on = outage_done = False
        while (elapsed := time.monotonic() - since) < config.duration_s:
            if not outage_on and elapsed >= outage[0]:
                mock.outage(True)
                outage_on = True
            if outage_on and not outage_done and elapsed >= outage[1]:
                mock.outage(False)
                outage_done = True
            next_sample = since + (len(rows) + 1) * config.sample_s
            next_event = since + (outage[0] if not outage_on else outage[1] if not outage_done else config.duration_s)
            time.sleep(max(0.0, min(next_sample, next_event, since + config.duration_s) - time.monotonic()))
            if time.monotonic() >= next_sample:
                rows.append(sample(worker, config, since, rows[-1] if rows else None, producer.sent))
        producer.stop()
        wanted = set(producer.ids)
        records = read_topic(
            bootstrap,
            [worker.topic("results"), worker.topic("dlq")],
            lambda r: wanted <= keys_seen(r),
            600,
            partitions=config.partitions,
        )
        seen = keys_seen(records)
        outcomes = [r for r in records if r.key is not None and r.key.decode() in wanted and r.value is not None]
        calls = mock.stats()
    finally:
        worker.stop()
        mock.stop()
    series = [{k: v for k, v in row.items() if not k.startswith("_")} for row in rows]
    return {
        "config": asdict(config),
        "produced": len(wanted),
        "lost": len(wanted - seen),
        "duplicate_outcomes": len(outcomes) - len({r.key for r in outcomes}),
        "backend_calls": calls.get("calls"),
        "series": series,
        "goals": goals(series, config),
    }


def goals(series: list[dict[str, Any]], config: SoakConfig) -> dict[str, Any]:
    """Steady outside the outage: breaker moves, lag, lateness; RSS over the last two thirds."""
    start, end = config.outage_at_s, config.outage_at_s + config.outage_s + config.settle_s
    steady = [r for r in series if r["t_s"] > config.sample_s and not (start <= r["t_s"] <= end + config.sample_s)]
    before = [r for r in series if r["t_s"] < start]
    moves_before = before[-1]["moves"] if before else 0
    moves_end = series[-1]["moves"] if series else 0
    moves_after_settle = next((r["moves"] for r in series if r["t_s"] > end), moves_end)
    lateness = [r["lateness_p99_ms"] for r in steady if r["lateness_p99_ms"] is not None]
    third = len(series) // 3
    rss_growth = (series[-1]["rss_mib"] / series[third]["rss_mib"] - 1) if third and series else None
    return {
        "moves_before_outage": moves_before,
        "moves_during_outage": moves_after_settle - moves_before,
        "moves_after_outage": moves_end - moves_after_settle,
        "max_lag_steady": max((r["consumer_lag"] for r in steady), default=None),
        "lag_goal": config.rate_per_s,
        "lateness_p99_ms_steady": {"median": statistics.median(lateness), "max": max(lateness)} if lateness else None,
        "rss_growth_last_two_thirds": None if rss_growth is None else round(rss_growth, 3),
        "breaker_opened_in_outage": any(r["breaker"] != "closed" for r in series if start <= r["t_s"] <= end),
    }


def markdown(soak: dict[str, Any]) -> list[str]:
    """The soak's summary and its series as Markdown."""
    g, c = soak["goals"], soak["config"]
    late = g["lateness_p99_ms_steady"] or {}
    lines = [
        f"### Soak: {c['rate_per_s']} requests/s for {c['duration_s'] / 60:g} min, {c['fail_once']} fail once, "
        f"{c['fail_always']} always, a {c['outage_s']} s outage halfway",
        "",
        f"Produced {soak['produced']:,}, lost {soak['lost']}, duplicate outcomes {soak['duplicate_outcomes']}. "
        f"Breaker moves: {g['moves_before_outage']} before the outage, {g['moves_during_outage']} around it, "
        f"{g['moves_after_outage']} after. "
        f"Steady state: lag at most {g['max_lag_steady']} (goal below {g['lag_goal']}), lateness p99 median "
        f"{late.get('median')} ms (max {late.get('max')} ms); "
        f"RSS growth over the last two thirds {g['rss_growth_last_two_thirds']:.1%}."
        if g["rss_growth_last_two_thirds"] is not None
        else "",
        "",
        "| t (s) | in/s | out/s | lag | lateness p99 (ms) | breaker | moves | held | RSS (MiB) | CPU % |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in soak["series"]:
        lines.append(
            f"| {r['t_s']:.0f} | {r['in_per_s']} | {r['out_per_s']} | {r['consumer_lag']} | {r['lateness_p99_ms']} | "
            f"{r['breaker']} | {r['moves']} | {r['held']} | {r['rss_mib']} | {r['cpu_pct']} |"
        )
    return lines


def plot(soak: dict[str, Any], out: Path) -> None:
    """soak.png: the series in four panels, the outage shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series, c = soak["series"], soak["config"]
    t = [r["t_s"] / 60 for r in series]
    fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    panels = [
        ([("in_per_s", "in"), ("out_per_s", "out")], "requests/s"),
        ([("consumer_lag", "consumer lag")], "messages"),
        ([("lateness_p99_ms", "retry lateness p99")], "ms"),
        ([("rss_mib", "RSS"), ("cpu_pct", "CPU %")], "MiB / %"),
    ]
    axes[2].set_yscale("symlog", linthresh=100)
    for ax, (lines, unit) in zip(axes, panels, strict=True):
        for key, label in lines:
            ax.plot(t, [r[key] if r[key] is not None else float("nan") for r in series], label=label)
        ax.axvspan(
            c["duration_s"] / 2 / 60, (c["duration_s"] / 2 + c["outage_s"]) / 60, color="#f4c7c3", label="outage"
        )
        ax.set_ylabel(unit)
        ax.legend(loc="upper right", fontsize=8)
    opened = [r["t_s"] / 60 for r in series if r["breaker"] != "closed"]
    for x in opened:
        axes[0].axvline(x, color="#c33", alpha=0.3)
    axes[-1].set_xlabel("minutes")
    axes[0].set_title(
        f"Soak: {c['rate_per_s']}/s, {c['fail_once']} once, {c['fail_always']} always; red lines: breaker not closed"
    )
    fig.tight_layout()
    fig.savefig(out / "soak.png", dpi=100)
    plt.close(fig)
