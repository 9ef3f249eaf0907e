"""In-memory stand-ins for Faust's tables, topics and events, and a fixed clock.

Enough of each to run the core paths (pipeline, scheduler, operator, recorder) in a
unit test: a table is a dict, a topic records what was sent, an event carries a message.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dlqapp.flowcontrol.input_gate import InputGate
from dlqapp.core.backoff import Backoff
from dlqapp.observability.lateness import LatenessWindow
from dlqapp.core.breaker import BreakerConfig, CircuitBreaker
from dlqapp.core.errors import DEFAULT_RETRYABLE, ErrorClass, InferenceError
from dlqapp.core.outcomes import RetryPolicy
from dlqapp.core.tiers import build_tiers
from dlqapp.deadletters.operator import Operator
from dlqapp.deadletters.recorder import DeadLetterRecorder
from dlqapp.inference import InferenceOutput
from dlqapp.retries.actions import RetryActions
from dlqapp.retries.parked import ParkedRetries
from dlqapp.retries.scheduler import RetryScheduler
from dlqapp.processing.flow import PriorityLimiter
from dlqapp.processing.partition_io import PartitionIO
from dlqapp.processing.pipeline import Outlets, Pipeline

PARTITIONS = 1  # one partition: every id is owned by the event's partition


class FakeTable(dict):
    """A Faust table: a dict of bytes, with a name; one partition, scanned in key order."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.data = self  # Faust's store: `_db_for_partition` gives the RocksDB

    def _db_for_partition(self, partition: int) -> "FakeTable":
        return self

    def iter(self, options: Any = None) -> "_Iterator":
        return _Iterator(sorted(self))


class _Iterator:
    """rocksdict's iterator protocol over sorted keys."""

    def __init__(self, keys: list[bytes]) -> None:
        self._keys, self._at = keys, 0

    def seek_to_first(self) -> None:
        self._at = 0

    def seek(self, key: bytes) -> None:
        self._at = next((i for i, k in enumerate(self._keys) if k >= key), len(self._keys))

    def valid(self) -> bool:
        return self._at < len(self._keys)

    def key(self) -> bytes:
        return self._keys[self._at]

    def next(self) -> None:
        self._at += 1


class FakeTopic:
    """A topic that records every send as (key, value, headers, partition)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[tuple[bytes, bytes | None, dict[str, str], int]] = []

    def get_topic_name(self) -> str:
        return self.name

    async def send(self, key: bytes, value: bytes | None, headers: Any = None, partition: int | None = None) -> asyncio.Future[None]:
        self.sent.append((key, value, {k: v.decode() for k, v in (headers or [])}, partition or 0))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def keys(self) -> list[str]:
        return [key.decode() for key, *_ in self.sent]


def send_to(*topics: FakeTopic) -> Any:
    """A producer's `send` (dlqapp.processing.partition_io.Send) that records into `topics` by name."""
    by_name = {topic.name: topic for topic in topics}

    async def send(topic: str, key: bytes, value: bytes | None, partition: int, headers: Any) -> asyncio.Future[None]:
        return await by_name[topic].send(key, value, headers, partition)

    return send


@dataclass
class FakeMessage:
    topic: str
    partition: int = 0
    offset: int = 0
    timestamp: float = 1_700_000_000.0
    value: bytes | None = None


@dataclass
class FakeEvent:
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes] = field(default_factory=dict)
    message: FakeMessage = field(default_factory=lambda: FakeMessage("input"))

    def __post_init__(self) -> None:
        self.message.value = self.value


class FixedClock:
    """Epoch milliseconds that move only when told to."""

    def __init__(self, now: int = 1_700_000_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class NullCounters:
    """Counters outside a stream: they count into a plain Counter."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def add(self, name: str, amount: int = 1) -> None:
        self.counts[name] += amount


class ScriptedBackend:
    """Succeeds, or fails the first `fail_times` calls of an id with `error`."""

    name = "scripted"

    def __init__(self, fail_times: dict[str, int] | None = None, error: ErrorClass = ErrorClass.SERVER_ERROR) -> None:
        self.fail_times = fail_times or {}
        self.error = error
        self.calls: Counter[str] = Counter()

    def calls_for(self, request_id: str) -> int:
        return self.calls[request_id]

    async def complete(self, request: Any, attempt: int, model: str | None = None) -> InferenceOutput:
        self.calls[request.request_id] += 1
        if self.calls[request.request_id] <= self.fail_times.get(request.request_id, 0):
            raise InferenceError(self.error, f"scripted {self.error.value}")
        return InferenceOutput(text="answer", model=model or "m")


@dataclass
class Worker:
    """The core components wired over fakes, as the composition root wires them over Faust."""

    backend: ScriptedBackend
    clock: FixedClock
    counters: NullCounters
    input: FakeTopic
    tiers: tuple[FakeTopic, ...]
    dlq: FakeTopic
    results: FakeTopic
    requests: FakeTable
    parked_table: FakeTable
    dead_letters: FakeTable
    ledger: FakeTable
    io: PartitionIO
    parked: ParkedRetries
    pipeline: Pipeline
    scheduler: RetryScheduler
    recorder: DeadLetterRecorder
    operator: Operator


def worker(tmp_path: Any, backend: ScriptedBackend | None = None, breaker: bool = False) -> Worker:
    backend = backend or ScriptedBackend()
    clock = FixedClock()
    counters = NullCounters()
    delays = (1000, 10_000, 60_000)
    tiers = build_tiers(delays, ("retry-1s", "retry-10s", "retry-1m"), "")
    tier_topics = tuple(FakeTopic(t.topic) for t in tiers)
    requests, parked_table, dead_letters, ledger = FakeTable("requests"), FakeTable("parked-retries"), FakeTable("dead-letters"), FakeTable("replay-ledger")
    input_topic, dlq, results = FakeTopic("input"), FakeTopic("dlq"), FakeTopic("results")
    io = PartitionIO(PARTITIONS, requests, counters, clock, send_to(input_topic, dlq, results, *tier_topics))  # type: ignore[arg-type]
    parked = ParkedRetries(parked_table, tiers)  # type: ignore[arg-type]
    policy = RetryPolicy(Backoff(delays), DEFAULT_RETRYABLE, max_age_ms=86_400_000)
    pipeline = Pipeline(
        backend,  # type: ignore[arg-type]
        policy,
        CircuitBreaker(BreakerConfig(enabled=breaker)),
        PriorityLimiter(8),
        io=io,
        parked=parked,
        outlets=Outlets(tuple(zip(tiers, tier_topics)), dlq, results),  # type: ignore[arg-type]
        max_payload_bytes=1_000_000,
        timeout_ms=5000,
        clock=clock,
        lateness=LatenessWindow(),
    )
    scheduler = RetryScheduler(parked, pipeline, io, None, InputGate(lambda: True, clock), batch=100, max_payload_bytes=1_000_000, clock=clock)  # type: ignore[arg-type]
    recorder = DeadLetterRecorder(dead_letters, FakeTable("dead-letters-by-time"), counters, str(tmp_path / "dead-letters.jsonl"))  # type: ignore[arg-type]
    retries = RetryActions(parked, scheduler, pipeline, io)
    operator = Operator(io, recorder, ledger, retries, input_topic=input_topic, dlq_topic=dlq, max_replays=5, clock=clock)  # type: ignore[arg-type]
    return Worker(backend, clock, counters, input_topic, tier_topics, dlq, results, requests, parked_table, dead_letters, ledger, io, parked, pipeline, scheduler, recorder, operator)


def request(request_id: str, **extra: Any) -> bytes:
    return json.dumps({"request_id": request_id, "prompt": f"hello {request_id}", **extra}).encode()


def state_of(w: Worker, request_id: str) -> dict[str, Any] | None:
    blob = w.requests.get(request_id.encode())
    return json.loads(blob) if blob else None
