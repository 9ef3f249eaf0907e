"""Faults under broker latency and rebalances, ending with the ledger check (A; B, a worker
whose partitions are revoked, is tests/chaos/test_revoked_partitions.py).

A. Offsets are never committed ahead of the table writes of the same step: three workers
   reach a broker of their own only through a proxy that delays every chunk by 200 ms
   each way, the mock LLM fails 20% of calls with 503 (so retries get parked in the
   parked-retries table), and a random worker that holds parked retries is killed -9 and
   restarted, again and again. A retry parked in a step whose input offset was committed
   before the parked entry reached the changelog would be lost by the next owner.

`make chaos` (CHAOS_FULL=1) runs A at full size (CHAOS_LATENCY=1 runs A reduced).
CHAOS_OVERLAPPING_KILLS=1 makes A kill again without waiting for the restarted worker to
be ready (rebalances overlap). When ids go missing, the failure names them, where they
were last seen (every topic and changelog), the group's committed offsets, and where
each worker's asyncio tasks wait (mode's SIGUSR1 dump, in the worker's log).
"""

from __future__ import annotations

import asyncio
import os
import random
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from tests.chaos.latency_support import calls_reached, mock_calls, parked, produce_ids, read_ledger, safe_get
from tests.chaos.ledger import FULL, Ledger, assert_guarantee, under_exactly_once
from tests.chaos.tcp_proxy import DelayProxy
from tests.chaos.test_faults import report
from tests.support import KAFKA_LOCAL, ROOT, MockLLM, Workers, free_port, unique, wait_until

LATENCY_S = 0.2
"""One-way delay the proxy adds to every chunk (so a round trip to the broker costs 400 ms)."""

ADVERTISED_PORT_VAR = "KAFKA_ADVERTISED_PORT"


# -- a broker of its own, reached only through the proxy ----------------------------------


def kafka_local_with_advertised_port(tmp_path: Path) -> Path:
    """scripts/kafka-local if it honours KAFKA_ADVERTISED_PORT, else a copy that does.

    Kafka clients connect to the address the broker advertises in its metadata, not to
    the bootstrap address they were given, so a proxy is only on the path when the
    broker advertises the proxy. The copy changes exactly two lines: ROOT (the copy
    lives elsewhere) and `advertised.listeners`, which becomes
    `PLAINTEXT://127.0.0.1:${KAFKA_ADVERTISED_PORT:-$KAFKA_PORT}`.
    """
    text = KAFKA_LOCAL.read_text()
    if ADVERTISED_PORT_VAR in text:
        return KAFKA_LOCAL
    root_line = 'ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"'
    advertised_line = "advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT"
    assert root_line in text and advertised_line in text, (
        "scripts/kafka-local changed: update kafka_local_with_advertised_port"
    )
    text = text.replace(root_line, f'ROOT="{ROOT}"').replace(
        advertised_line, "advertised.listeners=PLAINTEXT://127.0.0.1:${KAFKA_ADVERTISED_PORT:-$KAFKA_PORT}"
    )
    script = tmp_path / "kafka-local-advertised"
    script.write_text(text)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def advertised_brokers(bootstrap: str) -> list[tuple[str, int]]:
    """(host, port) of every broker in the metadata a client gets from `bootstrap`."""

    async def run() -> list[tuple[str, int]]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            return [(b.host, b.port) for b in producer.client.cluster.brokers()]
        finally:
            await producer.stop()

    return asyncio.run(run())


@pytest.fixture
def slow_kafka(tmp_path: Path) -> Iterator[DelayProxy]:
    """A dedicated broker that advertises, and is reached through, a 200 ms proxy."""
    broker_port = free_port()
    proxy = DelayProxy(upstream=("127.0.0.1", broker_port), delay_s=0)
    while proxy.port == broker_port:
        proxy.port = free_port()
    proxy.start()
    data_dir = tmp_path / "kafka"
    env = {
        **os.environ,
        "KAFKA_PORT": str(broker_port),
        "KAFKA_CONTROLLER_PORT": str(free_port()),
        "KAFKA_DATA_DIR": str(data_dir),
        ADVERTISED_PORT_VAR: str(proxy.port),
        "KAFKA_HEAP_OPTS": "-Xms128m -Xmx512m",
    }
    script = kafka_local_with_advertised_port(tmp_path)

    def kafka_local(command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(script), command], env=env, capture_output=True, text=True, timeout=300, check=check)

    try:
        started = kafka_local("start", check=False)
        assert started.returncode == 0, f"the proxied broker did not start:\n{started.stdout}\n{started.stderr}"
        brokers = advertised_brokers(proxy.address)
        assert brokers == [("127.0.0.1", proxy.port)], (
            f"clients would bypass the proxy: the broker advertises {brokers}"
        )
        proxy.delay_s = LATENCY_S
        yield proxy
    finally:
        kafka_local("stop", check=False)
        proxy.stop()


# -- A ----------------------------------------------------------------------------------------


@pytest.mark.skipif(
    not FULL and os.environ.get("CHAOS_LATENCY") != "1",
    reason="about 3 minutes: runs in make chaos (or with CHAOS_LATENCY=1)",
)
@pytest.mark.timeout(1800 if FULL else 600)
def test_offsets_are_never_committed_ahead_of_the_table_writes_of_the_same_step(slow_kafka: DelayProxy, tmp_path: Path):
    count = 20_000 if FULL else 2_000
    kills = 8 if FULL else 2
    overlapping = os.environ.get("CHAOS_OVERLAPPING_KILLS") == "1"
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "707")))
    mock = MockLLM(
        tmp_path, args=["--latency-ms", "10", "--jitter-ms", "5", "--fail", "503=0.2", "--seed", "13"]
    ).start()
    bootstrap = slow_kafka.address
    app_id = unique("app")
    env = {
        "DLQ_INFERENCE": "openai",
        "DLQ_INFERENCE_URL": mock.api_url,
        "DLQ_INFERENCE_TIMEOUT": "2s",
        # Long enough that retries sit parked when a worker dies, short enough to finish.
        "DLQ_RETRY_DELAYS": "1s,2s,3s",
        "DLQ_SESSION_TIMEOUT": "6s",
    }
    workers = [
        Workers(bootstrap, tmp_path).make(app_id=app_id, prefix=f"{app_id}.", name=f"w{n}", env_extra=env)
        for n in (1, 2, 3)
    ]
    started = time.monotonic()
    try:
        for worker in workers:  # together: one rebalance instead of three, each slow here
            worker.start(wait=False)
        for worker in workers:
            worker.wait_ready(timeout=240)
        wait_until(
            lambda: all(safe_get(w, "/").get("ready") for w in workers), 180, "three workers sharing the partitions"
        )
        phases = {"workers_ready_s": round(time.monotonic() - started)}
        first = workers[0]
        ids = [f"lat-{i}-{unique('x')[-6:]}" for i in range(count)]
        batches = [ids[len(ids) * k // (kills + 1) : len(ids) * (k + 1) // (kills + 1)] for k in range(kills + 1)]
        sent = 0
        kill_log = []
        for kill in range(kills):
            # Each kill lands while input flows and retries are parked on the victim.
            produce_ids(bootstrap, first.topic("input"), batches[kill])
            target = sent + int(len(batches[kill]) * rng.uniform(0.3, 0.7))
            sent += len(batches[kill])
            wait_until(calls_reached(mock, target), 600, f"{target} backend calls before kill {kill + 1}")
            holding = wait_until(
                lambda: [w for w in workers if parked(w) > 0], 120, f"parked retries before kill {kill + 1}"
            )
            victim = rng.choice(holding)
            kill_log.append({"victim": victim.name, "parked": parked(victim), "calls": mock_calls(mock)})
            victim.kill()
            victim.start(wait=False)
            if not overlapping:  # else the next kill may land while this restart still rebalances
                victim.wait_ready(timeout=240)
        produce_ids(bootstrap, first.topic("input"), batches[-1])
        phases["kills_done_s"] = round(time.monotonic() - started)
        ledger = read_ledger(workers, mock, ids, timeout=900 if FULL else 240)
        if under_exactly_once():  # duplicates too: whatever was written until the topics went quiet
            ledger = Ledger.read_to_end(first.bootstrap, first.topic("results"), first.topic("dlq"), ids)
        summary = {
            **ledger.summary(mock.url),
            "workers": 3,
            "kills": kills,
            "overlapping_kills": overlapping,
            "latency_ms": int(LATENCY_S * 1000),
            "proxy_connections": slow_kafka.connections,
            "seconds": round(time.monotonic() - started),
        }
        report("200 ms broker latency, three workers, kill -9 with parked retries", summary)
        print("kills:", kill_log, "phases:", phases)
        for worker in workers:
            assert worker.process.poll() is None, f"{worker.name} exited:\n{worker.log_tail()}"
        assert ledger.lost == [], f"{len(ledger.lost)} lost, e.g. {ledger.lost[:5]}; {summary}"
        assert ledger.mixed == [], f"ids with both a result and a dead letter: {ledger.mixed[:5]}"
        assert_guarantee(ledger, summary)
    finally:
        for worker in workers:
            worker.kill()
        mock.stop()
