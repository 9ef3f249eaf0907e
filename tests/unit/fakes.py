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

from dlqapp.core.errors import ErrorClass, InferenceError
from dlqapp.core.record import Record
from dlqapp.inference import InferenceOutput
from dlqapp.kafka.records import record_of
from dlqapp.settings import Settings
from dlqapp.tables.step import StepContext
from dlqapp.tables.topology import TierTopic, Topology
from dlqapp.wiring.components import Components, Ports
from dlqapp.wiring.composition import build_components
from tests.unit.fake_clock import FakeClock

PARTITIONS = 1  # one partition: every id is owned by the event's partition


class FakeTable(dict):
    """A Faust table: a dict of bytes, with a name; one partition, scanned in key order."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.data = self  # Faust's store: `_db_for_partition` gives the RocksDB

    def _db_for_partition(self, partition: int) -> FakeTable:
        return self

    def iter(self, options: Any = None) -> _Iterator:
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

    async def send(
        self, key: bytes, value: bytes | None, headers: Any = None, partition: int | None = None
    ) -> asyncio.Future[None]:
        self.sent.append((key, value, {k: v.decode() for k, v in (headers or [])}, partition or 0))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def keys(self) -> list[str]:
        return [key.decode() for key, *_ in self.sent]


def send_to(*topics: FakeTopic) -> Any:
    """A producer's `send` (dlqapp.tables.request_store.Send) that records into `topics` by name."""
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
    key: bytes | None = None
    headers: Any = None


@dataclass
class FakeEvent:
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes] = field(default_factory=dict)
    message: FakeMessage = field(default_factory=lambda: FakeMessage("input"))

    def __post_init__(self) -> None:
        self.message.key, self.message.value, self.message.headers = self.key, self.value, self.headers


def consumed(
    key: bytes | None, value: bytes | None, headers: dict[str, bytes] | None = None, message: FakeMessage | None = None
) -> Record:
    """A consumed message as the door makes it (`dlqapp.kafka.records.record_of`)."""
    return record_of(FakeEvent(key, value, headers or {}, message or FakeMessage("input")), FakeClock())  # type: ignore[arg-type]


class ScriptedBackend:
    """Succeeds, or fails the first `fail_times` calls of an id with `error`."""

    name = "scripted"
    bounds_its_calls = False

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


class FakeHandOver:
    """The due hop's producer: remembers what the timer handed over."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes, int, bool]] = []

    async def send(self, key: bytes, value: bytes, partition: int, *, now: bool = False) -> asyncio.Future[None]:
        self.sent.append((key, value, partition, now))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def fake_topology(settings: Settings) -> Topology:
    """Every topic and table of `settings`, in memory."""
    return Topology(
        input=FakeTopic(settings.input),
        tiers=tuple(TierTopic(tier, FakeTopic(tier.topic)) for tier in settings.tiers),
        due=FakeTopic(settings.due),
        dlq=FakeTopic(settings.dlq),
        results=FakeTopic(settings.results),
        commands=FakeTopic(settings.commands),
        parked_retries=FakeTable("parked-retries"),
        requests=FakeTable("requests"),
        dead_letters=FakeTable("dead-letters"),
        dead_letters_by_time=FakeTable("dead-letters-by-time"),
        replay_ledger=FakeTable("replay-ledger"),
        stats=FakeTable("stats"),
        progress=FakeTable("progress"),
        steps=StepContext(),
    )


STEP_ENTRY_POINTS = {
    "pipeline": {"on_input"},
    "scheduler": {"on_due", "park"},
    "operator": {"execute"},
    "recorder": {"on_message"},
}
"""What the agents call on each component, each call in a stream step of its own."""


class InSteps:
    """A component whose agent entry points each run in a stream step of partition 0, as an
    agent's window runs them (dlqapp.processing.flow)."""

    def __init__(self, target: Any, steps: Any, entry_points: set[str]) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_steps", steps)
        object.__setattr__(self, "_entry_points", entry_points)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)  # a test standing in for one of its methods

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._target, name)
        if name not in self._entry_points:
            return attribute

        async def in_step(*args: Any, **kwargs: Any) -> Any:
            async with self._steps.step(0):
                return await attribute(*args, **kwargs)

        return in_step


@dataclass
class Worker:
    """A worker's components as the composition root builds them, over in-memory fakes."""

    backend: ScriptedBackend
    clock: FakeClock
    topology: Topology
    components: Components

    def __getattr__(self, name: str) -> Any:
        component = getattr(self.components, name)  # w.pipeline, w.scheduler, w.operator, w.store, …
        if name in STEP_ENTRY_POINTS:
            return InSteps(component, self.components.steps, STEP_ENTRY_POINTS[name])
        return component

    @property
    def input(self) -> FakeTopic:
        return self.topology.input

    @property
    def tiers(self) -> tuple[FakeTopic, ...]:
        return tuple(t.topic for t in self.topology.tiers)

    @property
    def dlq(self) -> FakeTopic:
        return self.topology.dlq

    @property
    def results(self) -> FakeTopic:
        return self.topology.results

    @property
    def requests(self) -> FakeTable:
        return self.topology.requests

    @property
    def parked_table(self) -> FakeTable:
        return self.topology.parked_retries

    @property
    def dead_letters_table(self) -> FakeTable:
        return self.topology.dead_letters

    @property
    def ledger(self) -> FakeTable:
        return self.topology.replay_ledger

    @property
    def counts(self) -> Counter[str]:
        """What the counters hold for the one partition (written or not)."""
        counters = self.components.counters
        counts = counters.total([0], lambda partition, key: None)
        counts.update(counters.spend(0))
        return counts


def worker(
    tmp_path: Any,
    backend: ScriptedBackend | None = None,
    breaker: bool = False,
    span_exporters: tuple[Any, ...] = (),
    **env: str,
) -> Worker:
    """A one-partition worker built by `build_components` from settings over fakes (tracing
    on when given `span_exporters`: OpenTelemetry span exporters, e.g. an in-memory one)."""
    settings = Settings.from_env(
        {
            "DLQ_PARTITIONS": str(PARTITIONS),
            "DLQ_DATA_DIR": str(tmp_path),
            "DLQ_BREAKER": str(breaker).lower(),
            "DLQ_CONCURRENCY": "8",
            "DLQ_ADAPTIVE_CONCURRENCY": "false",
            "DLQ_INFERENCE_TIMEOUT": "5s",
            "DLQ_MAX_REPLAYS": "5",
            **env,
        }
    )
    backend = backend or ScriptedBackend()
    clock = FakeClock()
    topology = fake_topology(settings)
    topics = [
        topology.input,
        topology.dlq,
        topology.results,
        topology.due,
        topology.commands,
        *(t.topic for t in topology.tiers),
    ]
    ports = Ports(
        send=send_to(*topics),
        backend=backend,
        handover=FakeHandOver(),
        input_share=lambda: 1.0,
        hand_back=lambda event: None,
        clock=clock,
        span_exporters=span_exporters,
        owned_partitions=lambda: range(PARTITIONS),
    )
    components = build_components(settings, topology, ports)
    components.spend_view.ready.set()  # one worker owning every partition: its own counts are the cluster's
    return Worker(backend, clock, topology, components)


def request(request_id: str, **extra: Any) -> bytes:
    return json.dumps({"request_id": request_id, "prompt": f"hello {request_id}", **extra}).encode()


def state_of(w: Worker, request_id: str) -> dict[str, Any] | None:
    blob = w.requests.get(request_id.encode())
    return json.loads(blob) if blob else None
