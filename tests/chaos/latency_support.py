"""What the chaos scenarios under broker latency and rebalances share
(tests/chaos/test_latency_faults.py, A, and tests/chaos/test_revoked_partitions.py, B):
producing their ids, reading the workers and the mock LLM, and, when ids go missing, the
evidence a failure names (where they were last seen in every topic and changelog, the
group's committed offsets, and where each worker's asyncio tasks wait)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
import urllib.request
from collections import Counter
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.chaos.ledger import Ledger
from tests.kafka_io import produce, request_bytes
from tests.support import MockLLM, Worker, http_json


def produce_ids(bootstrap: str, topic: str, ids: list[str]) -> None:
    for start in range(0, len(ids), 5000):
        produce(bootstrap, topic, [(rid.encode(), request_bytes(rid)) for rid in ids[start : start + 5000]])


def mock_calls(mock: MockLLM) -> int:
    return mock.stats()["calls"]


def calls_reached(mock: MockLLM, target: int) -> Callable[[], bool]:
    """A `wait_until` predicate: the mock LLM has taken `target` calls."""
    return lambda: mock_calls(mock) >= target


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
        lines = [
            f"committed {tp.topic}[{tp.partition}]={meta.offset}"
            for tp, meta in sorted(committed.items())
            if "input" in tp.topic or "due" in tp.topic
        ]
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
                            headers = {
                                k: v.decode("utf-8", "replace")[:40]
                                for k, v in (m.headers or [])
                                if k in ("attempts", "retry_count", "scheduled_time", "error_class")
                            }
                            value = "null" if m.value is None else f"{len(m.value)}B {m.value[:100]!r}"
                            if m.value and m.topic.endswith("-requests-changelog"):
                                doc = json.loads(m.value)
                                value = str({k: doc.get(k) for k in ("state", "attempts", "tier", "due", "duplicates")})
                            found.append(
                                (
                                    m.timestamp,
                                    f"t={m.timestamp} {m.topic}[{m.partition}]@{m.offset} "
                                    f"key={(m.key or b'')[:60]!r} value={value} {headers}",
                                )
                            )
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
            lines.append(
                f"{worker.name}: in_flight={status.get('in_flight')} ready={status.get('ready')} "
                f"input={status.get('assignment', {}).get(worker.topic('input'))}"
            )
            lines += [
                f"{worker.name}: {line}"
                for line in metric_lines(
                    worker,
                    r"^(faust_messages_received_per_topics_partition|dlqapp_consumer_lag)\{.*input"
                    r"|^faust_(active_messages|total_active_events) ",
                )
            ]
        lines += trace_ids(first.bootstrap, first.app_id, missing[:5])
        lines += task_dumps(live)
        raise AssertionError("\n".join(lines)) from None
