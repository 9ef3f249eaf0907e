"""Play a History (tests/history/generate.py) against real workers and a real Kafka, and
collect what a checker needs (tests/history/check.py).

Only the public contract is used: the topics (produced to, and read back with
read_committed), the HTTP API and the CLI of the workers, their settings and logs, and
the mock LLM's control plane (`/_mock/plan`, `/_mock/call-log`).

    kafka = ProxiedKafka(tmp).start()      # one broker, reached only through a DelayProxy
    collected = HistoryRun(history, kafka, tmp / "h1").run()
    violations = check.check_all(collected)

Every history gets its own app id and topic prefix, its own mock LLM (`--log-calls`) and
its own workers (w1; w2 when it has a `join`). The broker is shared by the histories of a
test module: it advertises the proxy's address, so every client (workers, producer,
readers) goes through the proxy, and a `slow_broker` event only turns up its delay; a
`broker_restart` stops and starts it (`scripts/kafka-local`).

`collected` is plain JSON (saved next to the workers' logs as `collected.json`): the
history, the produced records (positions and digests), every committed record of
`results` and `dlq` (tombstones included), the replays seen on `input`, the tier topics'
counts, `GET /requests/{id}/` of every id, `GET /dlq/stats/`, the DLQ listing, the mock's
call log, each operator answer, each fault's time window, each SIGTERM's exit time and
each worker process's log summary (ready lines, restarts in place).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from tests.chaos.tcp_proxy import DelayProxy
from tests.history.generate import BUDGET_KINDS, HOLD_USD, OPERATOR_KINDS, Event, History
from tests.kafka_io import Record, read_until_quiet
from tests.support import FAUST, KAFKA_LOCAL, MockLLM, Worker, free_port, http_json, unique, wait_until

PARTITIONS = 3
"""DLQ_PARTITIONS of tests.support.Worker: every topic of a history has three."""
SETTLED = ("succeeded", "dead_lettered", "discarded")
DRAIN_TIMEOUT_S = 5.0
"""DLQ_DRAIN_TIMEOUT (its default): a SIGTERM must end the worker within this plus STOP_SLACK_S."""
STOP_SLACK_S = 5.0
STOP_WAIT_S = 30.0
"""How long a SIGTERM'd worker is watched before it is killed (well past its bound)."""
CONDITION_TIMEOUT_S = 30.0
"""How long an event waits for the state it needs (e.g. its target parked) before it goes anyway."""
REVIVALS = 3
"""How many times a history starts a crashed worker again."""
STUCK_S = 12.0
"""Settling ends early when nothing is parked and nothing changed for this long."""

READY_LINE = re.compile(r"\] ready console=")
RESTART_LINE = re.compile(r"restarting the worker to rebuild its tables[^\n]*")
FAILED_AT_START_LINE = re.compile(r"exactly-once transactions failed before the worker was ready[^\n]*")
CRASH_LINE = re.compile(r"^\[[^\]]+\] \[\d+\] \[(?:ERROR|CRITICAL)\] [^\n]*", re.M)
LOG_PID = re.compile(r"^\[[^\]]+\] \[(\d+)\]", re.M)

WORKER_ENV = {
    "DLQ_PROCESSING_GUARANTEE": "exactly_once",
    "DLQ_INFERENCE": "openai",
    "DLQ_INFERENCE_TIMEOUT": "5s",
    "DLQ_SESSION_TIMEOUT": "6s",
}


def now_ms() -> int:
    return int(time.time() * 1000)


def digest(value: bytes | None) -> str | None:
    return None if value is None else hashlib.sha256(value).hexdigest()


# -- the broker ----------------------------------------------------------------------------


class ProxiedKafka:
    """One broker (scripts/kafka-local) that advertises, and is reached through, a DelayProxy
    with no delay: a history can slow it down (`proxy.delay_s`) or restart it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.broker_port = free_port()
        self.proxy = DelayProxy(upstream=("127.0.0.1", self.broker_port), delay_s=0)
        while self.proxy.port == self.broker_port:
            self.proxy.port = free_port()
        self.env = {
            **os.environ,
            "KAFKA_BROKERS": "1",
            "KAFKA_PORT": str(self.broker_port),
            "KAFKA_CONTROLLER_PORT": str(free_port()),
            "KAFKA_DATA_DIR": str(tmp / "kafka"),
            "KAFKA_ADVERTISED_PORT": str(self.proxy.port),
            "KAFKA_HEAP_OPTS": "-Xms128m -Xmx512m",
        }

    @property
    def bootstrap(self) -> str:
        return self.proxy.address

    def _run(self, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(KAFKA_LOCAL), command], env=self.env, capture_output=True, text=True, timeout=300)
        if check and done.returncode != 0:
            raise AssertionError(f"kafka-local {command} failed:\n{done.stdout}\n{done.stderr}")
        return done

    def start(self) -> ProxiedKafka:
        self.proxy.start()
        self._run("start")
        return self

    def restart(self) -> None:
        self._run("stop")
        self._run("start")

    def stop(self) -> None:
        self._run("stop", check=False)
        self.proxy.stop()
        log = self.tmp / "kafka" / "kafka.log"
        if log.exists():  # the broker's side of a failure, kept with the histories' logs
            shutil.copy(log, self.tmp / "kafka.log")
        shutil.rmtree(self.tmp / "kafka", ignore_errors=True)


# -- producing -----------------------------------------------------------------------------


class Producer:
    """An aiokafka producer on a loop of its own (a thread), used synchronously: each send
    returns where the record landed. Its client logs are silenced: during a broker restart
    it retries (idempotently) and says so many times a second."""

    def __init__(self, bootstrap: str) -> None:
        self._aiokafka_level = logging.getLogger("aiokafka").level
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # given back by close()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="history-producer", daemon=True)
        self.thread.start()

        async def make() -> AIOKafkaProducer:  # aiokafka wants its loop running
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap,
                acks="all",
                enable_idempotence=True,
                linger_ms=2,
                max_request_size=4 * 1024 * 1024,
                request_timeout_ms=60_000,
            )
            await producer.start()
            return producer

        self.producer = self._call(make())

    def _call(self, coro: Any, timeout: float = 180) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def send_many(
        self, topic: str, records: list[tuple[bytes | None, bytes | None, int | None, int | None]]
    ) -> list[tuple[int, int, int]]:
        """Send (key, value, partition, timestamp_ms) records; (partition, offset, timestamp) of each."""

        async def go() -> list[tuple[int, int, int]]:
            futures = [
                await self.producer.send(topic, value=v, key=k, partition=p, timestamp_ms=ts) for k, v, p, ts in records
            ]
            done = await asyncio.gather(*futures)
            return [(m.partition, m.offset, m.timestamp) for m in done]

        return self._call(go())

    def close(self) -> None:
        try:
            self._call(self.producer.stop(), timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            logging.getLogger("aiokafka").setLevel(self._aiokafka_level)


# -- workers -------------------------------------------------------------------------------


class TrackedWorker:
    """A tests.support.Worker whose every process (a run) is recorded: when it started and
    ended, how, and which part of the (shared, appended) log file is its."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.runs: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        """Held while the runner starts or stops the process, so the watchdog never takes
        an exit the runner caused for a crash."""
        self.revived = 0

    @property
    def name(self) -> str:
        return self.worker.name

    @property
    def running(self) -> bool:
        return self.worker.process is not None and self.worker.process.poll() is None

    def _log_size(self) -> int:
        try:
            return self.worker.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def start(self) -> str | None:
        """Start a process and wait until it is ready; the error when it never was."""
        with self.lock:
            run = {"started_ms": now_ms(), "log_from": self._log_size(), "ended_ms": None, "ended_by": None}
            self.runs.append(run)
            self.worker.start(wait=False)
            assert self.worker.process is not None
            run["pid"] = self.worker.process.pid
        try:
            self.worker.wait_ready(timeout=120)
        except AssertionError as exc:
            run["ready_ms"] = None
            return str(exc)[:2000]
        run["ready_ms"] = now_ms()
        return None

    def note_started_ahead(self) -> None:
        """Note how many requests the running process started ahead of their turn so far
        (its `dlqapp_started_ahead_of_turn_total`: the tail read, dlqapp.kafka.tail_read)."""
        if not self.runs or not self.running:
            return
        try:
            with urllib.request.urlopen(self.worker.url + "/metrics", timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return
        found = re.findall(r"^dlqapp_started_ahead_of_turn_total(?:\{[^}]*\})? (\S+)$", text, re.M)
        if found:  # one line per tenant
            run = self.runs[-1]
            run["started_ahead"] = max(run.get("started_ahead", 0), int(sum(float(value) for value in found)))

    def _ended(self, how: str) -> None:
        if self.runs and self.runs[-1]["ended_ms"] is None:
            code = self.worker.process.returncode if self.worker.process is not None else None
            self.runs[-1].update(ended_ms=now_ms(), ended_by=how, exit_code=code)

    def kill(self, how: str = "kill") -> None:
        with self.lock:
            self.worker.kill()
            self._ended(how)

    def crashed(self) -> bool:
        """Whether the process ended by itself (nobody here stopped it); recorded as such."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            process = self.worker.process
            if not self.runs or self.runs[-1]["ended_ms"] is not None or process is None or process.poll() is None:
                return False
            self._ended("crashed")
            return True
        finally:
            self.lock.release()

    def sigterm(self) -> dict[str, Any]:
        """SIGTERM, then watch: how long the process took to exit (None: not within
        STOP_WAIT_S, then it is killed), and whether it restarted itself meanwhile."""
        with self.lock:
            return self._sigterm()

    def _sigterm(self) -> dict[str, Any]:
        process = self.worker.process
        assert process is not None
        log_at = self._log_size()
        sent = time.monotonic()
        sent_ms = now_ms()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=STOP_WAIT_S)
            exit_s: float | None = round(time.monotonic() - sent, 2)
        except subprocess.TimeoutExpired:
            exit_s = None
            self.worker.kill()
        after = self._read_log(log_at)
        pid_gone = True
        try:
            os.kill(process.pid, 0)
            pid_gone = False
        except ProcessLookupError:
            pass
        except PermissionError:  # the pid belongs to somebody else now: ours is gone
            pass
        self._ended("sigterm" if exit_s is not None else "sigterm+kill")
        return {
            "worker": self.name,
            "pid": process.pid,
            "sent_ms": sent_ms,
            "exit_s": exit_s,
            "exit_code": process.returncode,
            "bound_s": DRAIN_TIMEOUT_S + STOP_SLACK_S,
            "pid_gone": pid_gone,
            "restart_lines_after_signal": RESTART_LINE.findall(after)[:5],
            "ready_lines_after_signal": len(READY_LINE.findall(after)),
        }

    def _read_log(self, start: int, end: int | None = None) -> str:
        try:
            with open(self.worker.log_path, "rb") as f:
                f.seek(start)
                data = f.read() if end is None else f.read(max(0, end - start))
        except FileNotFoundError:
            return ""
        return data.decode("utf-8", "replace")

    def summary(self) -> list[dict[str, Any]]:
        """Each run with what its part of the log says: ready lines, restarts in place, pids."""
        runs = []
        for i, run in enumerate(self.runs):
            end = self.runs[i + 1]["log_from"] if i + 1 < len(self.runs) else None
            text = self._read_log(run["log_from"], end)
            runs.append(
                {
                    **run,
                    "worker": self.name,
                    "ready_lines": len(READY_LINE.findall(text)),
                    "restart_lines": RESTART_LINE.findall(text)[:10],
                    "restarts": len(RESTART_LINE.findall(text)),
                    "failed_at_start": FAILED_AT_START_LINE.findall(text)[:3],
                    "crash_lines": CRASH_LINE.findall(text)[:5] if run.get("ended_by") == "crashed" else [],
                    "pids": sorted(set(LOG_PID.findall(text))),
                    "log": str(self.worker.log_path),
                }
            )
        return runs


# -- a history, played -----------------------------------------------------------------------


class HistoryRun:
    """Plays one history against its own workers and mock, then collects (see the module doc)."""

    def __init__(self, history: History, kafka: ProxiedKafka, tmp: Path, mock_args: list[str] | None = None) -> None:
        self.history = history
        self.kafka = kafka
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.app_id = unique("hist")
        self.prefix = f"{self.app_id}."
        self.mock = MockLLM(tmp, args=[*(mock_args or ["--latency-ms", "20", "--jitter-ms", "10"]), "--log-calls"])
        self.workers: dict[str, TrackedWorker] = {}
        self.produced: list[dict[str, Any]] = []
        self.payloads: dict[str, bytes] = {}
        self.operator: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        self.sigterms: list[dict[str, Any]] = []
        self.played: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.producer: Producer | None = None
        self._timers: list[threading.Timer] = []
        self._lanes: dict[str, threading.Thread] = {}
        self._lanes_lock = threading.Lock()
        self._stop_watching = threading.Event()
        self.crashes: list[dict[str, Any]] = []

    # -- set-up ----------------------------------------------------------------------

    def topic(self, name: str) -> str:
        return self.prefix + name

    def env(self) -> dict[str, str]:
        return {**WORKER_ENV, "DLQ_INFERENCE_URL": self.mock.api_url, **self.history.worker_settings}

    def _worker(self, name: str) -> TrackedWorker:
        if name not in self.workers:
            worker = Worker(
                self.kafka.bootstrap, self.tmp, app_id=self.app_id, prefix=self.prefix, env_extra=self.env(), name=name
            )
            self.workers[name] = TrackedWorker(worker)
        return self.workers[name]

    def live(self) -> list[TrackedWorker]:
        return [w for w in self.workers.values() if w.running]

    def _watch(self) -> None:
        """A worker that ended by itself is recorded as crashed and started again, as an
        orchestrator would (at most REVIVALS times a worker), so the history goes on."""
        ticks = 0
        while not self._stop_watching.wait(0.5):
            ticks += 1
            for worker in list(self.workers.values()):
                if ticks % 4 == 0:
                    worker.note_started_ahead()
                if worker.crashed():
                    self.crashes.append({"worker": worker.name, "at_ms": now_ms(), "run": len(worker.runs) - 1})
                    if worker.revived < REVIVALS:
                        worker.revived += 1
                        fault = self._fault("revival", worker=worker.name, event=-1)
                        self._lane(worker.name, -1, lambda w=worker, f=fault: self._restart(w, f))

    # -- the whole run ---------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        began = time.monotonic()
        self.mock.start()
        try:
            error = self._worker("w1").start()
            if error:
                self.errors.append(f"w1 did not start: {error}")
            self.producer = Producer(self.kafka.bootstrap)
            threading.Thread(target=self._watch, name="history-watchdog", daemon=True).start()
            started = time.monotonic()
            self.started_ms = now_ms()
            waiting: list[threading.Thread] = []
            for index, event in enumerate(self.history.events):
                wait = started + event.at - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if waits_for_a_state(event):
                    # it waits for its state on a thread of its own: the timeline goes on
                    thread = threading.Thread(target=self._play, args=(index, event), daemon=True)
                    thread.start()
                    waiting.append(thread)
                else:
                    self._play(index, event)
            with self._lanes_lock:
                lanes = list(self._lanes.values())
            for thread in [*waiting, *lanes]:
                thread.join(300)
            for fault in self.faults:
                fault["end_ms"] = fault["end_ms"] or now_ms()
            played_s = time.monotonic() - started
            settled = self._settle()
            collected = self._collect()
            collected["timing"] = {
                "total_s": round(time.monotonic() - began, 1),
                "events_s": round(played_s, 1),
                "settled": settled,
            }
            return collected
        finally:
            self._stop_watching.set()
            for timer in self._timers:
                timer.cancel()
            self.kafka.proxy.delay_s = 0
            if self.producer is not None:
                self.producer.close()
            for worker in self.workers.values():
                if worker.running:
                    worker.kill("end of history")
            self.mock.stop()

    # -- events ----------------------------------------------------------------------

    def _play(self, index: int, event: Event) -> None:
        entry: dict[str, Any] = {"index": index, "kind": event.kind, "planned_s": event.at, "at_ms": now_ms()}
        self.played.append(entry)
        try:
            handler = getattr(self, f"_on_{event.kind}")
            note = handler(index, event)
            if note:
                entry["note"] = note
        except Exception as exc:  # a history goes on: the checker judges what happened
            entry["error"] = f"{type(exc).__name__}: {exc}"[:1000]
            self.errors.append(f"event {index} ({event.kind}): {entry['error']}")
        entry["done_ms"] = now_ms()

    def _send(self, index: int, event: Event, records: list[dict[str, Any]]) -> None:
        """Produce `records` (each: key, value, partition, skew_ms, and what the checker
        needs to know of it) to `input` and remember where each landed."""
        assert self.producer is not None
        batch = []
        for r in records:
            skew = r.get("skew_ms") or 0
            batch.append((r["key"], r["value"], r.get("partition"), now_ms() + skew if skew else None))
        sent_ms = now_ms()
        positions = self.producer.send_many(self.topic("input"), batch)
        for r, (partition, offset, timestamp) in zip(records, positions, strict=True):
            value = r["value"]
            self.produced.append(
                {
                    "event": index,
                    "kind": event.kind,
                    "id": r.get("id"),
                    "about": event.target,
                    "key": r["key"].decode() if r["key"] is not None else None,
                    "valid": r.get("valid", False),
                    "bad": r.get("bad", False),
                    "tenant": r.get("tenant"),
                    "null": value is None,
                    "sha256": digest(value),
                    "len": None if value is None else len(value),
                    "partition": partition,
                    "offset": offset,
                    "timestamp": timestamp,
                    "skew_ms": r.get("skew_ms") or 0,
                    "sent_ms": sent_ms,
                }
            )

    def _request_bytes(self, rid: str, prompt_chars: int = 0, tenant: str | None = None) -> bytes:
        content = f"hello {rid}" + ("." * prompt_chars)
        doc: dict[str, Any] = {"request_id": rid, "messages": [{"role": "user", "content": content}]}
        if tenant is not None:
            doc["metadata"] = {"tenant": tenant}
        return json.dumps(doc).encode()

    def _on_request(self, index: int, event: Event) -> None:
        args = event.args
        rid = args["id"]
        plan = args.get("plan")
        if plan:
            spec = {"request_id": rid, "fail_times": plan["fail_times"], "status": plan["status"]}
            if plan.get("retry_after") is not None:
                spec["retry_after"] = plan["retry_after"]
            self.mock.plan(**spec)
        value = self._request_bytes(rid, args.get("prompt_chars") or 0, args.get("tenant"))
        self.payloads[rid] = value
        key = rid.encode() if args.get("keyed") else None
        self._send(
            index,
            event,
            [
                {
                    "id": rid,
                    "key": key,
                    "value": value,
                    "partition": args.get("partition"),
                    "skew_ms": args.get("skew_ms"),
                    "valid": True,
                    "tenant": args.get("tenant"),
                }
            ],
        )

    def _on_duplicate(self, index: int, event: Event) -> str | None:
        rid = event.args["id"]
        note = self._wait_for_state(rid, event.args.get("after", "sent"))
        value = self.payloads.get(rid) or self._request_bytes(rid)
        key = rid.encode() if event.args.get("keyed") else None
        self._send(
            index,
            event,
            [{"id": rid, "key": key, "value": value, "skew_ms": event.args.get("skew_ms"), "valid": True}],
        )
        return note

    def _on_invalid_copy(self, index: int, event: Event) -> str | None:
        rid = event.args["id"]
        note = self._wait_for_state(rid, event.args.get("after", "sent"))
        readable: str | None = rid
        if event.args.get("form") == "non_json":
            value, readable = b"\xff\xfe not json, a copy of " + rid.encode(), None
        else:
            value = json.dumps({"request_id": rid}).encode()
        key = rid.encode() if event.args.get("keyed") else None
        self._send(index, event, [{"id": readable, "key": key, "value": value, "bad": True}])
        return note

    def _sized_request(self, rid: str, size: int) -> bytes:
        """A JSON request of exactly `size` bytes (its prompt is the padding)."""
        empty = self._request_bytes(rid)
        body = json.loads(empty)
        body["messages"][0]["content"] += "x" * max(0, size - len(empty))
        value = json.dumps(body).encode()
        assert len(value) == size or size < len(empty), (len(value), size)
        return value

    def _on_near_limit(self, index: int, event: Event) -> None:
        args = event.args
        size = args["size"]
        readable: str | None = args["id"]
        if args.get("form") == "json":
            value = self._sized_request(args["id"], size)
        else:
            head = f"not json: a record of {size} bytes ({args['id']}) ".encode()
            value, readable = (head + b"#" * size)[:size], None
        record = {"id": readable, "key": None, "value": value, "partition": args.get("partition"), "bad": True}
        self._send(index, event, [record])

    def _on_oversize(self, index: int, event: Event) -> None:
        rid = event.args["id"]
        value = self._sized_request(rid, event.args["size"])
        self._send(index, event, [{"id": rid, "key": rid.encode(), "value": value, "bad": True}])

    def _on_null(self, index: int, event: Event) -> None:
        key = event.args.get("key") or "null"  # a record with neither key nor value cannot be sent
        record = {"key": key.encode(), "value": None, "partition": event.args.get("partition")}
        self._send(index, event, [{**record, "bad": True}])

    def _on_burst(self, index: int, event: Event) -> None:
        prefix, count = event.args["prefix"], event.args["count"]
        records = [
            {
                "id": f"{prefix}{i}",
                "key": f"{prefix}{i}".encode(),
                "value": json.dumps({"request_id": f"{prefix}{i}"}).encode(),
                "bad": True,
            }
            for i in range(count)
        ]
        self._send(index, event, records)

    def _on_flood(self, index: int, event: Event) -> None:
        prefix, count, tenant = event.args["prefix"], event.args["count"], event.args.get("tenant")
        records = []
        for i in range(count):
            rid = f"{prefix}{i}"
            value = self.payloads[rid] = self._request_bytes(rid, tenant=tenant)
            records.append({"id": rid, "key": rid.encode(), "value": value, "valid": True, "tenant": tenant})
        self._send(index, event, records)

    # -- waiting for a state ------------------------------------------------------------

    def _get(self, path: str, timeout: float = 10) -> tuple[int | None, Any]:
        """A read from the first live worker that answers (None, error text when none did)."""
        last: Any = "no live worker"
        for worker in self.live():
            try:
                return http_json(worker.worker.url + path, timeout=timeout)
            except OSError as exc:
                last = f"{type(exc).__name__}: {exc}"
        return None, last

    def _request_state(self, rid: str) -> dict[str, Any]:
        status, body = self._get(f"/requests/{urllib.parse.quote(rid, safe='')}/")
        return body if status == 200 and isinstance(body, dict) else {}

    def _wait_for_state(self, rid: str, after: str) -> str | None:
        """Wait until `rid` is `after` (`sent`: no wait); a note when it never was."""
        if after == "sent":
            return None

        def reached() -> bool:
            state = self._request_state(rid)
            if after == "parked":  # or past it already: no use waiting for what will not come
                return bool(state.get("parked")) or state.get("state") in ("retry_scheduled", *SETTLED)
            return state.get("state") == after

        return self._wait(reached, f"{rid} {after}")

    def _wait(self, predicate: Any, what: str, timeout: float = CONDITION_TIMEOUT_S) -> str | None:
        try:
            wait_until(predicate, timeout, what, interval=0.2)
            return None
        except AssertionError:
            return f"not reached within {timeout:.0f}s: {what} (went on anyway)"

    def _has_dead_letter(self, rid: str) -> bool:
        return self._get(f"/dlq/{urllib.parse.quote(rid, safe='')}/")[0] == 200

    # -- operator ----------------------------------------------------------------------

    def _ask(self, method: str, path: str, body: Any = None) -> tuple[int | None, Any]:
        """A mutation on a live worker. A refused connection (nothing was asked) moves on
        to the next worker, or waits for one; any other failure (a reset, a timeout) is
        recorded as it is: the action may or may not have happened, and asking again
        would be another action."""
        deadline = time.monotonic() + 60
        while True:
            for worker in self.live():
                try:
                    return http_json(worker.worker.url + path, method, body, timeout=60)
                except OSError as exc:
                    if isinstance(getattr(exc, "reason", exc), ConnectionRefusedError):
                        continue
                    return None, f"no answer: {type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                return None, "no worker took the request"
            time.sleep(0.5)

    def _cli(self, *args: str) -> tuple[int | None, Any]:
        """`faust -A dlqapp <args> --json` against a live worker: (exit code, decoded stdout)."""
        live = self.live()
        if not live:
            return None, "no live worker"
        env = {**os.environ, **live[0].worker.env(), "DLQ_WEB_URL": live[0].worker.url}
        done = subprocess.run(
            [str(FAUST), "-A", "dlqapp", *args, "--json"],
            env=env,
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=180,
        )
        try:
            body: Any = json.loads(done.stdout)
        except ValueError:
            body = {"stdout": done.stdout[-2000:], "stderr": done.stderr[-2000:]}
        return done.returncode, body

    def _operator(self, index: int, event: Event, via: str, asked: Any, call: Any) -> None:
        asked_ms = now_ms()
        status, body = call()
        self.operator.append(
            {
                "event": index,
                "action": event.kind,
                "via": via,
                "id": event.args.get("id"),
                "asked": asked,
                "asked_ms": asked_ms,
                "answered_ms": now_ms(),
                "status": status,
                "body": body,
            }
        )

    def _on_replay(self, index: int, event: Event) -> str | None:
        rid, via = event.args["id"], event.args.get("via", "http")
        note = self._wait(lambda: self._has_dead_letter(rid), f"a dead letter for {rid}")
        payload, force = event.args.get("payload"), bool(event.args.get("force"))
        if via == "cli" and payload is None:
            call = lambda: self._cli("dlq-reprocess", "--key", rid, *(["--force"] if force else []))  # noqa: E731
        else:
            via = "http"
            body = {k: v for k, v in (("payload", payload), ("force", force or None)) if v is not None} or None
            call = lambda: self._ask("POST", f"/dlq/{urllib.parse.quote(rid, safe='')}/reprocess/", body)  # noqa: E731
        self._operator(index, event, via, {"id": rid, "edited": payload is not None, "force": force}, call)
        return note

    def _on_replay_all(self, index: int, event: Event) -> str | None:
        notes = [
            self._wait(lambda r=r: self._has_dead_letter(r), f"a dead letter for {r}")
            for r in event.args.get("wait_for") or []
        ]
        error_class, via = event.args.get("error_class"), event.args.get("via", "http")
        if via == "cli":
            call = lambda: self._cli("dlq-reprocess", "--all", *(["--error-class", error_class] if error_class else []))  # noqa: E731
        else:
            body = {"all": True, **({"error_class": error_class} if error_class else {})}
            call = lambda: self._ask("POST", "/dlq/reprocess/", body)  # noqa: E731
        self._operator(index, event, via, {"all": True, "error_class": error_class}, call)
        return "; ".join(n for n in notes if n) or None

    def _on_discard(self, index: int, event: Event) -> str | None:
        rid, via = event.args["id"], event.args.get("via", "http")
        note = self._wait(lambda: self._has_dead_letter(rid), f"a dead letter for {rid}")
        if via == "cli":
            call = lambda: self._cli("dlq-discard", "--key", rid)  # noqa: E731
        else:
            call = lambda: self._ask("DELETE", f"/dlq/{urllib.parse.quote(rid, safe='')}/")  # noqa: E731
        self._operator(index, event, via, {"id": rid}, call)
        return note

    def _parked(self, rid: str) -> bool:
        """Parked now, or settled already (then the action will find nothing, as it may)."""
        state = self._request_state(rid)
        return bool(state.get("parked")) or state.get("state") in SETTLED

    def _retry_action(self, index: int, event: Event, action: str) -> str | None:
        rid, via = event.args["id"], event.args.get("via", "http")
        note = self._wait(lambda: self._parked(rid), f"a parked retry for {rid}")
        if via == "cli":
            call = lambda: self._cli("retry-now", "--key", rid, *(["--dead-letter"] if action == "dead-letter" else []))  # noqa: E731
        else:
            call = lambda: self._ask("POST", f"/retries/{urllib.parse.quote(rid, safe='')}/{action}/", {})  # noqa: E731
        self._operator(index, event, via, {"id": rid}, call)
        return note

    def _on_run_now(self, index: int, event: Event) -> str | None:
        return self._retry_action(index, event, "run-now")

    def _on_dead_letter_now(self, index: int, event: Event) -> str | None:
        return self._retry_action(index, event, "dead-letter")

    def _budget(self, index: int, event: Event, day_usd: float | None) -> None:
        body = {"tenant": event.args["tenant"], "day_usd": day_usd}
        asked = {**body, "pair": event.args["pair"]}
        self._operator(index, event, "http", asked, lambda: self._ask("POST", "/budgets/", body))

    def _on_budget_hold(self, index: int, event: Event) -> None:
        self._budget(index, event, HOLD_USD)

    def _on_budget_release(self, index: int, event: Event) -> None:
        self._budget(index, event, None)

    # -- faults ------------------------------------------------------------------------

    def _fault(self, kind: str, **detail: Any) -> dict[str, Any]:
        """Record a fault as it starts; its `end_ms` is set when it is over."""
        fault = {"kind": kind, "start_ms": now_ms(), "end_ms": None, **detail}
        self.faults.append(fault)
        return fault

    def _lane(self, lane: str, index: int, work: Any) -> None:
        """Run `work` on a thread of its own, after the previous fault on the same `lane` (a
        worker, the broker) is over: a restart takes seconds, and producers and operators
        do not wait for it."""
        previous = self._lanes.get(lane)

        def go() -> None:
            if previous is not None:
                previous.join()
            try:
                work()
            except Exception as exc:  # the history goes on: the checker judges what happened
                self.errors.append(f"event {index} ({lane}): {type(exc).__name__}: {exc}"[:1000])

        thread = threading.Thread(target=go, name=f"fault-{lane}-{index}", daemon=True)
        with self._lanes_lock:
            self._lanes[lane] = thread
        thread.start()

    def _restart(self, worker: TrackedWorker, fault: dict[str, Any]) -> None:
        error = worker.start()
        if error:
            self.errors.append(f"{worker.name} did not start again: {error}")
        fault["end_ms"] = now_ms()

    def _stats_reached(self, event: Event) -> None:
        """Wait (at most CONDITION_TIMEOUT_S) until each count of `GET /dlq/stats/` named in
        the event's `when_stats` reached its value: a fault that must land in the middle of
        a burst (`{"dlq_size": 400}`) or of a bulk replay (`{"reprocessed": 20}`)."""
        wanted = event.args.get("when_stats") or {}
        if wanted:

            def reached() -> bool:
                status, stats = self._get("/dlq/stats/")
                return status == 200 and all((stats.get(k) or 0) >= v for k, v in wanted.items())

            note = self._wait(reached, f"stats {wanted}")
            if note:
                self.errors.append(f"{event.kind}: {note}")

    def _on_kill(self, index: int, event: Event) -> None:
        name = event.args.get("worker", "w1")

        def work() -> None:
            self._stats_reached(event)
            worker = self.workers.get(name)
            if worker is None or not worker.running:
                return
            fault = self._fault("kill", worker=name, event=index)
            worker.kill()
            self._restart(worker, fault)

        self._lane(name, index, work)

    def _on_sigterm(self, index: int, event: Event) -> None:
        name = event.args.get("worker", "w1")

        def work() -> None:
            self._stats_reached(event)
            worker = self.workers.get(name)
            if worker is None or not worker.running:
                return
            fault = self._fault("sigterm", worker=name, event=index)
            self.sigterms.append({**worker.sigterm(), "event": index})
            self._restart(worker, fault)

        self._lane(name, index, work)

    def _on_join(self, index: int, event: Event) -> None:
        def work() -> None:
            worker = self._worker("w2")
            if worker.running:
                return
            fault = self._fault("join", worker="w2", event=index)
            error = worker.start()
            if error:
                self.errors.append(f"w2 did not start: {error}")
            fault["end_ms"] = now_ms()

        self._lane("w2", index, work)

    def _on_leave(self, index: int, event: Event) -> None:
        def work() -> None:
            worker = self.workers.get("w2")
            if worker is None or not worker.running:
                return
            fault = self._fault("leave", worker="w2", event=index)
            self.sigterms.append({**worker.sigterm(), "event": index})
            fault["end_ms"] = now_ms()

        self._lane("w2", index, work)

    def _on_broker_restart(self, index: int, event: Event) -> None:
        def work() -> None:
            fault = self._fault("broker_restart", event=index)
            try:
                self.kafka.restart()
            finally:
                fault["end_ms"] = now_ms()

        self._lane("broker", index, work)

    def _on_slow_broker(self, index: int, event: Event) -> None:
        delay_ms, for_s = event.args.get("delay_ms", 200), float(event.args.get("for_s", 5))
        fault = self._fault("slow_broker", delay_ms=delay_ms, event=index)
        fault["end_ms"] = fault["start_ms"] + int(for_s * 1000)
        self.kafka.proxy.delay_s = delay_ms / 1000
        timer = threading.Timer(for_s, lambda: setattr(self.kafka.proxy, "delay_s", 0))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    # -- settling ----------------------------------------------------------------------

    def valid_ids(self) -> list[str]:
        return sorted({p["id"] for p in self.produced if p["valid"]})

    def _settle(self) -> dict[str, Any]:
        """Wait until every valid id is settled, nothing is parked and nothing waits on a
        topic (or nothing changed for STUCK_S with nothing parked, or settle_s passed)."""
        ids = self.valid_ids()
        began = time.monotonic()
        deadline = began + self.history.settle_s
        last: Any = None
        changed = time.monotonic()
        while True:
            states = {rid: self._request_state(rid).get("state") for rid in ids}
            status, health = self._get("/health/")
            total = health.get("total", {}) if status == 200 and isinstance(health, dict) else {}
            parked = sum((total.get("parked_by_tier") or {}).values()) if total else None
            lag, in_flight = total.get("consumer_lag"), total.get("in_flight")
            snapshot = (states, parked, lag, in_flight)
            if snapshot != last or status != 200:
                last, changed = snapshot, time.monotonic()
            unsettled = sorted(rid for rid, s in states.items() if s not in SETTLED)
            if not unsettled and parked == 0 and lag == 0 and in_flight == 0:
                return {"how": "settled", "after_s": round(time.monotonic() - began, 1)}
            if parked == 0 and time.monotonic() - changed > STUCK_S:
                return {"how": "stuck", "after_s": round(time.monotonic() - began, 1), "unsettled": unsettled[:20]}
            if time.monotonic() > deadline:
                return {"how": "timeout", "after_s": round(time.monotonic() - began, 1), "unsettled": unsettled[:20]}
            time.sleep(1.0)

    # -- collecting --------------------------------------------------------------------

    def _read(self, topics: list[str]) -> list[Record]:
        return read_until_quiet(self.kafka.bootstrap, topics, PARTITIONS, None, quiet_s=3.0, timeout=180)

    def _collect(self) -> dict[str, Any]:
        for fault in self.faults:  # a revival may still be under way
            fault["end_ms"] = fault["end_ms"] or now_ms()
        results_topic, dlq_topic, input_topic = self.topic("results"), self.topic("dlq"), self.topic("input")
        status, root = self._get("/")
        if status != 200:  # a worker may be on its way back: wait for one, once
            self._wait(lambda: self._get("/")[0] == 200, "a worker answering")
            status, root = self._get("/")
        topics = root.get("topics", []) if status == 200 else []
        tier_topics = [t for t in topics if t.startswith(self.prefix + "retry-")]
        if status != 200:
            self.errors.append(f"no worker answered GET / at the end: {root}")
        # one read of every topic, once their end offsets stayed put (committed records only)
        records = self._read([results_topic, dlq_topic, input_topic, *tier_topics])
        outcomes = [outcome_of(r, results_topic) for r in records if r.topic in (results_topic, dlq_topic)]
        replays_on_input = [
            {
                "key": r.key.decode("utf-8", "replace") if r.key else None,
                "partition": r.partition,
                "offset": r.offset,
                "sha256": digest(r.value),
                "headers": {k: v for k, v in r.headers.items() if k.startswith("replay")},
            }
            for r in records
            if r.topic == input_topic and "replay_of" in r.headers
        ]
        tiers = {topic: 0 for topic in tier_topics}
        for record in records:
            if record.topic in tiers:
                tiers[record.topic] += 1
        lookup = set(self.valid_ids())
        lookup |= {
            p["id"] for p in self.produced if p["id"] and p["kind"] in ("invalid_copy", "near_limit", "oversize")
        }
        lookup |= {op["id"] for op in self.operator if op.get("id")}
        for op in self.operator:
            body = op.get("body")
            if isinstance(body, dict):
                lookup |= {owner_id(k) for k in body.get("reprocessed", []) if isinstance(k, str)}
        requests = {}
        for rid in sorted(lookup):
            status, body = self._get(f"/requests/{urllib.parse.quote(rid, safe='')}/")
            requests[rid] = {"status": status, "body": trim_request(body) if status == 200 else body}
        stats = self._get("/dlq/stats/")
        dlq_pages = self._dlq_listing()
        calls = http_json(self.mock.url + "/_mock/call-log", timeout=60)[1]
        return {
            "history": json.loads(self.history.to_json()),
            "app_id": self.app_id,
            "prefix": self.prefix,
            "topics": {"input": input_topic, "results": results_topic, "dlq": dlq_topic, "tiers": tier_topics},
            "settings": {
                **self.history.worker_settings,
                "drain_timeout_s": DRAIN_TIMEOUT_S,
                "stop_bound_s": DRAIN_TIMEOUT_S + STOP_SLACK_S,
            },
            "started_ms": self.started_ms,
            "played": self.played,
            "produced": self.produced,
            "outcomes": outcomes,
            "replays_on_input": replays_on_input,
            "tier_counts": tiers,
            "requests": requests,
            "stats": {"status": stats[0], "body": stats[1]},
            "dlq_listing": dlq_pages,
            "calls": calls.get("calls", []),
            "operator": self.operator,
            "faults": [dict(f) for f in self.faults],
            "sigterms": self.sigterms,
            "worker_runs": [run for w in self.workers.values() for run in w.summary()],
            "crashes": self.crashes,
            "errors": self.errors,
        }

    def _dlq_listing(self) -> dict[str, Any]:
        """`GET /dlq/` paged to the end: its total, counts and every key."""
        keys: list[str] = []
        first: dict[str, Any] = {}
        offset = 0
        while True:
            status, page = self._get(f"/dlq/?limit=1000&offset={offset}", timeout=60)
            if status != 200 or not isinstance(page, dict):
                return {"status": status, "error": page, "keys": keys}
            first = first or page
            keys += [i.get("key") or i["request_id"] for i in page["items"]]
            offset += 1000
            if not page["items"] or offset >= page["total"]:
                break
        return {
            "status": 200,
            "total": first.get("total"),
            "counts": first.get("counts"),
            "incomplete": first.get("incomplete"),
            "keys": keys,
        }


def waits_for_a_state(event: Event) -> bool:
    """Whether the event waits for a state before it acts (an operator action, a copy sent
    once its request is parked, …): such an event is played on a thread of its own. A budget's
    hold and release wait for nothing, and keep their order."""
    if event.kind in BUDGET_KINDS:
        return False
    return event.kind in OPERATOR_KINDS or event.args.get("after", "sent") != "sent"


def owner_id(key: str) -> str:
    """The request id a DLQ key belongs to (`<id>~<class>~<digest>` is an invalid copy's)."""
    parts = key.split("~")
    return parts[0] if len(parts) >= 3 else key


def outcome_of(record: Record, results_topic: str) -> dict[str, Any]:
    """A committed record of `results` or `dlq`, as the checker reads it."""
    value = record.value
    doc = None
    if record.topic == results_topic and value:
        try:
            doc = json.loads(value)
            doc.pop("output", None)
        except ValueError:
            doc = None
    headers = dict(record.headers)
    if "original_headers" in headers:
        headers["original_headers"] = headers["original_headers"][:500]
    return {
        "topic": "results" if record.topic == results_topic else "dlq",
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": record.key.decode("utf-8", "replace") if record.key is not None else None,
        "tombstone": value is None,
        "sha256": digest(value),
        "len": None if value is None else len(value),
        "preview": base64.b64encode(value[:64]).decode() if value else None,
        "headers": headers,
        "result": doc,
    }


def trim_request(body: Any) -> Any:
    """What the checker reads of `GET /requests/{id}/` (state, attempts, parked, ledger, …)."""
    if not isinstance(body, dict):
        return body
    keep = (
        "state",
        "attempts",
        "parked",
        "dead_letter",
        "ledger",
        "attempt_history",
        "duplicates",
        "first_seen",
        "history",
    )
    return {k: body.get(k) for k in keep}


def save(collected: dict[str, Any], path: Path) -> Path:
    path.write_text(json.dumps(collected, indent=1, default=str))
    return path
