"""Faults under broker latency and rebalances, each ending with the ledger check.

A. Offsets are never committed ahead of the table writes of the same step: three workers
   reach a broker of their own only through a proxy that delays every chunk by 200 ms
   each way, the mock LLM fails 20% of calls with 503 (so retries get parked in the
   parked-retries table), and a random worker that holds parked retries is killed -9 and
   restarted, again and again. A retry parked in a step whose input offset was committed
   before the parked entry reached the changelog would be lost by the next owner.
B. A worker whose partitions are revoked stops writing for them: during a provider
   outage (breaker on) two workers hold full in-flight windows, a third joins (the
   partitions move while requests are held), the outage lasts on, then recovery and a
   kill -9. Nothing is lost, and backend calls beyond the recorded attempts stay within
   the in-flight windows the faults can orphan.

`make test` runs B reduced; `make chaos` (CHAOS_FULL=1) runs A and B at full size
(CHAOS_LATENCY=1 runs A reduced).
CHAOS_OVERLAPPING_KILLS=1 makes A kill again without waiting for the restarted worker to
be ready (rebalances overlap). When ids go missing, the failure names them, where they
were last seen (every topic and changelog), the group's committed offsets, and where
each worker's asyncio tasks wait (mode's SIGUSR1 dump, in the worker's log).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import stat
import subprocess
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.chaos.ledger import FULL, Ledger
from tests.chaos.tcp_proxy import DelayProxy
from tests.chaos.test_faults import report
from tests.kafka_io import produce, request_bytes
from tests.support import KAFKA_LOCAL, ROOT, MockLLM, Worker, free_port, http_json, unique, wait_until

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
    assert root_line in text and advertised_line in text, "scripts/kafka-local changed: update kafka_local_with_advertised_port"
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
        assert brokers == [("127.0.0.1", proxy.port)], f"clients would bypass the proxy: the broker advertises {brokers}"
        proxy.delay_s = LATENCY_S
        yield proxy
    finally:
        kafka_local("stop", check=False)
        proxy.stop()


# -- helpers --------------------------------------------------------------------------------


def produce_ids(bootstrap: str, topic: str, ids: list[str]) -> None:
    for start in range(0, len(ids), 5000):
        produce(bootstrap, topic, [(rid.encode(), request_bytes(rid)) for rid in ids[start : start + 5000]])


def mock_calls(mock: MockLLM) -> int:
    return mock.stats()["calls"]


def safe_get(worker: Worker, path: str) -> dict:
    """A worker's JSON answer, or {} while it is down, rebalancing or slow."""
    try:
        status, body = http_json(worker.url + path, timeout=5)
    except OSError:
        return {}
    return body if status == 200 and isinstance(body, dict) else {}


def parked(worker: Worker) -> int:
    return int(safe_get(worker, "/retries/_local/?top=1").get("total") or 0)


def breaker(worker: Worker) -> dict:
    """This worker's breaker snapshot (/dlq/stats/ merges every worker's, keyed by URL)."""
    breakers = safe_get(worker, "/dlq/stats/").get("breaker") or {}
    mine = [b for url, b in breakers.items() if url.rstrip("/") == worker.url]
    return mine[0] if len(mine) == 1 else {}


def breaker_state(worker: Worker) -> str | None:
    return breaker(worker).get("state")


def held_during_outage(worker: Worker) -> int:
    """dlqapp_held_during_outage_total on one worker: calls the breaker held (not attempts)."""
    with urllib.request.urlopen(worker.url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    match = re.search(r"^dlqapp_held_during_outage_total\s+([0-9.e+]+)$", text, re.M)
    return int(float(match.group(1))) if match else 0


def metric_lines(worker: Worker, pattern: str) -> list[str]:
    """Lines of a worker's /metrics that match `pattern` (empty when it does not answer)."""
    try:
        with urllib.request.urlopen(worker.url + "/metrics", timeout=10) as response:
            text = response.read().decode()
    except OSError:
        return []
    return [line for line in text.splitlines() if re.search(pattern, line)]


def calls_by_id(mock: MockLLM, ids: list[str]) -> dict[str, int]:
    calls = http_json(mock.url + "/_mock/calls", timeout=60)[1]
    return {rid: calls.get(rid, 0) for rid in ids}


def log_lines(workers: list[Worker], pattern: str, limit: int = 20) -> list[str]:
    """Lines of the workers' logs that match `pattern` (evidence for a report)."""
    found: list[tuple[str, str]] = []
    regex = re.compile(pattern)
    for worker in workers:
        try:
            for line in worker.log_path.read_text(errors="replace").splitlines():
                if regex.search(line):
                    found.append((line[:25], f"{worker.name}: {line[:400]}"))
        except FileNotFoundError:
            continue
    return [line for _, line in sorted(found)][-limit:]


def outcome_keys(bootstrap: str, topics: list[str], partitions: int = 3) -> set[str]:
    """Keys with a non-null record on `topics`, read from the beginning to the end offsets."""

    async def run() -> set[str]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        try:
            tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
            consumer.assign(tps)
            await consumer.seek_to_beginning()
            ends = await consumer.end_offsets(tps)
            keys: set[str] = set()
            while any([await consumer.position(tp) < ends[tp] for tp in tps]):
                for messages in (await consumer.getmany(timeout_ms=500)).values():
                    keys.update(m.key.decode() for m in messages if m.key is not None and m.value is not None)
            return keys
        finally:
            await consumer.stop()

    return asyncio.run(run())


def trace_ids(bootstrap: str, app_id: str, ids: list[str]) -> list[str]:
    """Every record of the app's topics (changelogs included) whose key or value names one
    of `ids`, and the group's committed offsets: where a missing request was last seen."""
    wanted = [rid.encode() for rid in ids]

    async def run() -> list[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            topics = sorted(t for t in await admin.list_topics() if t.startswith(app_id))
            described = await admin.describe_topics(topics) if topics else []
            committed = await admin.list_consumer_group_offsets(app_id)
        finally:
            await admin.close()
        lines = [f"committed {tp.topic}[{tp.partition}]={meta.offset}" for tp, meta in sorted(committed.items()) if "input" in tp.topic or "due" in tp.topic]
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        try:
            tps = [TopicPartition(d["topic"], p["partition"]) for d in described for p in d["partitions"]]
            if not tps:
                return lines
            consumer.assign(tps)
            await consumer.seek_to_beginning()
            ends = await consumer.end_offsets(tps)
            found: list[tuple[int, str]] = []
            while any([await consumer.position(tp) < ends[tp] for tp in tps]):
                for messages in (await consumer.getmany(timeout_ms=500)).values():
                    for m in messages:
                        blob = (m.key or b"") + b"|" + (m.value or b"")[:2000]
                        if any(w in blob for w in wanted):
                            headers = {k: v.decode("utf-8", "replace")[:40] for k, v in (m.headers or []) if k in ("attempts", "retry_count", "scheduled_time", "error_class")}
                            value = "null" if m.value is None else f"{len(m.value)}B {m.value[:100]!r}"
                            if m.value and m.topic.endswith("-requests-changelog"):
                                doc = json.loads(m.value)
                                value = str({k: doc.get(k) for k in ("state", "attempts", "tier", "due", "duplicates")})
                            found.append((m.timestamp, f"t={m.timestamp} {m.topic}[{m.partition}]@{m.offset} key={(m.key or b'')[:60]!r} value={value} {headers}"))
            return lines + [line for _, line in sorted(found)]
        finally:
            await consumer.stop()

    return asyncio.run(run())


def task_dumps(workers: list[Worker]) -> list[str]:
    """Where each live worker's asyncio tasks wait, from mode's SIGUSR1 dump (all task stacks,
    written to the worker's log): tasks counted by their innermost dlqapp frame."""
    sizes = {w.name: w.log_path.stat().st_size for w in workers}
    for worker in workers:
        worker.process.send_signal(signal.SIGUSR1)
    time.sleep(5)
    lines = []
    for worker in workers:
        with open(worker.log_path, "rb") as f:
            f.seek(sizes[worker.name])
            dump = f.read().decode(errors="replace")
        where: Counter[str] = Counter()
        for block in dump.split("  TASK ")[1:]:
            frames = re.findall(r'File "[^"]*/(dlqapp/[^"]+|faust/[^"]+)", line (\d+), in (\w+)', block)
            ours = [f for f in frames if f[0].startswith("dlqapp/")]
            if ours:
                where[" <- ".join(f"{p}:{n} {fn}" for p, n, fn in reversed(ours[-3:]))] += 1
        lines.append(f"{worker.name} tasks (see the SIGUSR1 dump in {worker.log_path}): {dict(where.most_common(8))}")
    return lines


def read_ledger(workers: list[Worker], mock: MockLLM, ids: list[str], timeout: float) -> Ledger:
    """Ledger.read; when ids are missing, fail with what the workers and the mock know of them."""
    first = workers[0]
    try:
        return Ledger.read(first.bootstrap, first.topic("results"), first.topic("dlq"), ids, timeout=timeout)
    except AssertionError as exc:
        seen = outcome_keys(first.bootstrap, [first.topic("results"), first.topic("dlq")])
        missing = [rid for rid in ids if rid not in seen]
        lines = [f"{exc}: {len(missing)} ids without an outcome, e.g. {missing[:10]}"]
        live = [w for w in workers if w.process and w.process.poll() is None]
        for rid in missing[:5]:
            state = safe_get(live[0], f"/requests/{rid}/") if live else {}
            lines.append(f"{rid}: mock calls {mock.calls(rid)}; state {state}")
            lines += log_lines(workers, re.escape(rid), 10)
        lines.append(f"parked per worker: {[(w.name, safe_get(w, '/retries/_local/?top=0')) for w in live]}")
        for worker in live:
            status = safe_get(worker, "/")
            lines.append(f"{worker.name}: in_flight={status.get('in_flight')} ready={status.get('ready')} input={status.get('assignment', {}).get(worker.topic('input'))}")
            lines += [f"{worker.name}: {line}" for line in metric_lines(worker, r"^(faust_messages_received_per_topics_partition|dlqapp_consumer_lag)\{.*input|^faust_(active_messages|total_active_events) ")]
        lines += trace_ids(first.bootstrap, first.app_id, missing[:5])
        lines += task_dumps(live)
        raise AssertionError("\n".join(lines)) from None


# -- A ----------------------------------------------------------------------------------------


@pytest.mark.skipif(not FULL and os.environ.get("CHAOS_LATENCY") != "1", reason="about 3 minutes: runs in make chaos (or with CHAOS_LATENCY=1)")
@pytest.mark.timeout(1800 if FULL else 600)
def test_offsets_are_never_committed_ahead_of_the_table_writes_of_the_same_step(slow_kafka: DelayProxy, tmp_path: Path):
    count = 20_000 if FULL else 2_000
    kills = 8 if FULL else 2
    overlapping = os.environ.get("CHAOS_OVERLAPPING_KILLS") == "1"
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "707")))
    mock = MockLLM(tmp_path, args=["--latency-ms", "10", "--jitter-ms", "5", "--fail", "503=0.2", "--seed", "13"]).start()
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
    workers = [Worker(bootstrap, tmp_path, app_id=app_id, prefix=f"{app_id}.", name=f"w{n}", env_extra=env) for n in (1, 2, 3)]
    started = time.monotonic()
    try:
        for worker in workers:  # together: one rebalance instead of three, each slow here
            worker.start(wait=False)
        for worker in workers:
            worker.wait_ready(timeout=240)
        wait_until(lambda: all(safe_get(w, "/").get("ready") for w in workers), 180, "three workers sharing the partitions")
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
            wait_until(lambda: mock_calls(mock) >= target, 600, f"{target} backend calls before kill {kill + 1}")
            holding = wait_until(lambda: [w for w in workers if parked(w) > 0], 120, f"parked retries before kill {kill + 1}")
            victim = rng.choice(holding)
            kill_log.append({"victim": victim.name, "parked": parked(victim), "calls": mock_calls(mock)})
            victim.kill()
            victim.start(wait=False)
            if not overlapping:  # else the next kill may land while this restart still rebalances
                victim.wait_ready(timeout=240)
        produce_ids(bootstrap, first.topic("input"), batches[-1])
        phases["kills_done_s"] = round(time.monotonic() - started)
        ledger = read_ledger(workers, mock, ids, timeout=900 if FULL else 240)
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
    finally:
        for worker in workers:
            worker.kill()
        mock.stop()


# -- B ----------------------------------------------------------------------------------------


@pytest.mark.timeout(1800 if FULL else 600)
def test_a_worker_whose_partitions_are_revoked_stops_writing_for_them(make_worker, tmp_path: Path):
    count = 10_000 if FULL else 2_000
    outage_s = 120 if FULL else 20
    concurrency = 8
    rebalances, kills = 1, 1
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "808")))
    mock = MockLLM(tmp_path, args=["--latency-ms", "50", "--jitter-ms", "10", "--seed", "17"]).start()
    env = {
        "DLQ_INFERENCE": "openai",
        "DLQ_INFERENCE_URL": mock.api_url,
        "DLQ_INFERENCE_TIMEOUT": "2s",
        "DLQ_RETRY_DELAYS": "200ms,400ms,600ms",
        "DLQ_SESSION_TIMEOUT": "6s",
        "DLQ_CONCURRENCY": str(concurrency),
        "DLQ_BREAKER": "true",
        "DLQ_BREAKER_OPEN": "2s",
        "DLQ_BREAKER_MAX_OPEN": "8s",
    }
    started = time.monotonic()
    try:
        first = make_worker(env_extra=env, name="w1").start()
        second = make_worker(app_id=first.app_id, prefix=first.prefix, env_extra=env, name="w2").start()
        pair = [first, second]
        wait_until(lambda: all(safe_get(w, "/").get("ready") for w in pair), 120, "two workers sharing the partitions")

        mock.outage(True)
        ids = [f"rev-{i}-{unique('x')[-6:]}" for i in range(count)]
        produce_ids(first.bootstrap, first.topic("input"), ids)
        # Full windows: every worker's breaker open and 2 x DLQ_CONCURRENCY requests held.
        wait_until(
            lambda: all(breaker_state(w) in ("open", "half_open") and safe_get(w, "/").get("in_flight", 0) >= 2 * concurrency for w in pair),
            120,
            "both breakers open with full in-flight windows",
        )
        held_before_join = {w.name: safe_get(w, "/").get("in_flight") for w in pair}

        third = make_worker(app_id=first.app_id, prefix=first.prefix, env_extra=env, name="w3").start()
        workers = [*pair, third]
        joined = time.monotonic()
        wait_until(lambda: all(safe_get(w, "/").get("ready") and safe_get(w, "/").get("assigned_partitions") for w in workers), 120, "three workers sharing the partitions")
        time.sleep(max(0.0, outage_s - (time.monotonic() - joined)))
        calls_at_recovery = mock_calls(mock)
        mock.outage(False)

        # Breakers close by themselves once the backend answers; a breaker that stays open
        # or half-open holds the requests of its partitions for good. Then every hold is
        # counted (nothing is held after).
        try:
            wait_until(lambda: all(breaker_state(w) == "closed" for w in workers), 120, "every breaker closed after the outage")
        except AssertionError as exc:
            snapshots = {w.name: {k: breaker(w).get(k) for k in ("state", "waiting", "moves", "transitions")} for w in workers}
            evidence = log_lines(workers, r"breaker_|in_flight_released|Revoking|Worker ready", 40)
            raise AssertionError(f"{exc}: {json.dumps(snapshots)}\n" + "\n".join(evidence)) from None
        held = {w.name: held_during_outage(w) for w in workers}
        wait_until(lambda: mock_calls(mock) >= calls_at_recovery + count // 4, 300, "a quarter of the run after recovery")
        victim = rng.choice(workers)
        victim.kill()

        ledger = read_ledger(workers, mock, ids, timeout=600 if FULL else 240)
        calls = calls_by_id(mock, ids)
        per_id_extra = Counter(calls[rid] - ledger.attempts.get(rid, 0) for rid in ids)
        extra = ledger.extra_calls(mock.url)
        bound = len(workers) * concurrency * (rebalances + kills)
        summary = {
            **ledger.summary(mock.url),
            "workers": 3,
            "concurrency": concurrency,
            "rebalances": rebalances,
            "kills": kills,
            "outage_s": outage_s,
            "held_by_breaker": sum(held.values()),
            "extra_calls_not_held": extra - sum(held.values()),
            "extra_calls_bound": bound,
            "seconds": round(time.monotonic() - started),
        }
        report("outage, rebalance and kill -9 with full in-flight windows", summary)
        print("in flight before the join:", held_before_join, "held by breaker:", held, "victim:", victim.name)
        print("ids by extra calls:", dict(sorted(per_id_extra.items())))
        assert ledger.lost == [], f"{len(ledger.lost)} lost, e.g. {ledger.lost[:5]}; {summary}"
        assert ledger.mixed == [], f"ids with both a result and a dead letter: {ledger.mixed[:5]}"
        # A call the breaker held is by design not an attempt; every other extra call is one
        # a fault orphaned: at most the calls in flight on each worker, per fault.
        assert extra - sum(held.values()) <= bound, summary
        # Per request: at most one held call per handling, one orphaned call per fault.
        per_id_bound = 1 + 2 * (rebalances + kills)
        over = {rid: calls[rid] - ledger.attempts.get(rid, 0) for rid in ids if calls[rid] - ledger.attempts.get(rid, 0) > per_id_bound}
        assert not over, f"ids called more often than their attempts allow: {dict(list(over.items())[:10])}"
        # Once the windows are released nothing of the revoked assignment runs, so Faust's
        # wait for acks ends at once; it warns after 10 s of waiting (a handler running for a
        # partition the group may have given to another worker: see InFlightWindow.release).
        stuck = log_lines(workers, r"wait_empty: Waiting for tasks", 5)
        assert not stuck, "a revocation waited for handlers of the revoked assignment:\n" + "\n".join(line[:300] for line in stuck)
    finally:
        mock.stop()
