"""`tls_cost`: what a secured Kafka costs dlqapp (issue 31).

The loads of `overhead` (the mock answers at once, 64 calls in flight) and `llm_scale`
(2,000 ± 500 ms, 1,024 in flight), each run by a dlqapp worker on a plaintext broker and
by one on a SASL_SSL broker (SCRAM-SHA-512 over TLS, scripts/kafka-local), in turns within
one run, so the machine's load falls alike on both: requests/s and CPU s per 1,000.

    .venv/bin/python bench/run.py --only tls_cost
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import (
    MockLLM,
    SecureKafka,
    Worker,
    all_keys_seen,
    produce,
    read_topic,
    request_bytes,
    unique,
    unique_ids,
)
from bench.measure import cpu_seconds, spread, throughput_of


@dataclass(frozen=True)
class Load:
    name: str
    latency_ms: int
    jitter_ms: int
    concurrency: int
    requests: int


LOADS = (Load("overhead", 0, 0, 64, 20_000), Load("llm_scale", 2000, 500, 1024, 12_000))


@dataclass(frozen=True)
class Broker:
    name: str
    bootstrap: str
    client: dict[str, Any]
    """aiokafka options of the bench's own producer and reader."""
    worker_env: dict[str, str]


def measure(broker: Broker, load: Load, mock: MockLLM, tmp: Path, count: int) -> dict[str, float]:
    """One run: a fresh worker, `count` requests at once, every result read back."""
    worker = Worker(
        broker.bootstrap,
        tmp,
        name=unique("tls"),
        env_extra={
            "DLQ_INFERENCE": "openai",
            "DLQ_INFERENCE_URL": mock.api_url,
            "DLQ_CONCURRENCY": str(load.concurrency),
            "DLQ_ADAPTIVE_CONCURRENCY": "false",
            "DLQ_RETRY_DELAYS": "1s,2s,3s",
            "DLQ_LOG_LEVEL": "warning",
            **broker.worker_env,
        },
    )
    worker.start()
    try:
        ids = unique_ids("t", count)
        assert worker.process is not None and mock.process is not None
        cpu = cpu_seconds(worker.process.pid)
        for start in range(0, count, 10_000):
            produce(
                broker.bootstrap,
                worker.topic("input"),
                [(rid.encode(), request_bytes(rid)) for rid in ids[start : start + 10_000]],
                client=broker.client,
            )
        records = read_topic(
            broker.bootstrap, worker.topic("results"), all_keys_seen(set(ids)), 1800, client=broker.client
        )
        cpu = cpu_seconds(worker.process.pid) - cpu
    finally:
        worker.kill()
    first = {r.key: r for r in reversed(records)}
    return {"requests_per_s": throughput_of(list(first.values())), "cpu_s_per_1k": cpu * 1000 / count}


def run_tls_cost(bootstrap: str, tmp: Path, runs: int = 3, requests: int = 0) -> dict[str, Any]:
    """Both loads on both brokers, `runs` rounds; medians, ranges and the SASL_SSL/plaintext ratios."""
    secured = SecureKafka(tmp / "tls-kafka", "sasl_ssl", authorizer=False).start()
    try:
        brokers = (
            Broker("plaintext", bootstrap, {}, {}),
            Broker("sasl_ssl", secured.bootstrap, secured.admin_client(), secured.client_env()),
        )
        out: dict[str, Any] = {"runs": runs, "security": "SASL_SSL, SCRAM-SHA-512, TLS 1.3, one broker on this machine"}
        for load in LOADS:
            count = requests or load.requests
            mock = MockLLM(
                tmp, args=["--latency-ms", str(load.latency_ms), "--jitter-ms", str(load.jitter_ms), "--seed", "5"]
            ).start()
            rows: dict[str, list[dict[str, float]]] = {b.name: [] for b in brokers}
            try:
                for run in range(runs):
                    for broker in brokers:
                        rows[broker.name].append(measure(broker, load, mock, tmp, count))
                        row = rows[broker.name][-1]
                        print(
                            f"  {load.name} run {run + 1} {broker.name}: {row['requests_per_s']:.1f} req/s, "
                            f"{row['cpu_s_per_1k']:.2f} CPU s/1k",
                            flush=True,
                        )
            finally:
                mock.stop()
            section: dict[str, Any] = {
                "requests": count,
                "latency_ms": load.latency_ms,
                "concurrency": load.concurrency,
            }
            for name, measured in rows.items():
                section[name] = {
                    "runs": measured,
                    **{f: spread([r[f] for r in measured]) for f in ("requests_per_s", "cpu_s_per_1k")},
                }
            section["ratio_sasl_ssl_to_plaintext"] = {
                f: section["sasl_ssl"][f]["median"] / section["plaintext"][f]["median"]
                for f in ("requests_per_s", "cpu_s_per_1k")
            }
            out[load.name] = section
        return out
    finally:
        secured.stop()


def markdown(cost: dict[str, Any]) -> list[str]:
    lines = [
        f"### TLS cost: dlqapp on plaintext beside SASL_SSL ({cost['security']}), "
        f"{cost['runs']} runs each, median (min–max)",
        "",
        "| load | broker | requests/s | CPU s per 1,000 |",
        "|---|---|---|---|",
    ]
    for load in ("overhead", "llm_scale"):
        if load not in cost:
            continue
        section = cost[load]
        for broker in ("plaintext", "sasl_ssl"):
            r, c = section[broker]["requests_per_s"], section[broker]["cpu_s_per_1k"]
            lines.append(
                f"| {load} ({section['latency_ms']} ms, {section['concurrency']} in flight) | {broker} | "
                f"{r['median']:.0f} ({r['min']:.0f}–{r['max']:.0f}) | "
                f"{c['median']:.2f} ({c['min']:.2f}–{c['max']:.2f}) |"
            )
        ratio = section["ratio_sasl_ssl_to_plaintext"]
        lines.append(
            f"| {load} | SASL_SSL / plaintext | {ratio['requests_per_s']:.2f}x | {ratio['cpu_s_per_1k']:.2f}x |"
        )
    return lines
