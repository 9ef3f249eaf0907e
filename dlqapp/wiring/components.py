"""What a worker is made of (`Components`) and what it talks to beyond itself (`Ports`):
the component graph `dlqapp.wiring.composition.build_components` builds, typed."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dlqapp.core.clock import Clock, now_ms
from dlqapp.deadletters.alerts import AlertBatcher
from dlqapp.deadletters.operator import Operator
from dlqapp.deadletters.recorder import DeadLetterRecorder, OldestDeadLetter
from dlqapp.deadletters.replay_jobs import ReplayJobs
from dlqapp.deadletters.writer import DeadLetterWriter
from dlqapp.flowcontrol.input_gate import InputGate
from dlqapp.inference import InferenceBackend
from dlqapp.kafka.acks import Acks
from dlqapp.kafka.offset_watch import OffsetWatch
from dlqapp.kafka.tail_read import Ends, TailConsumer, TailRead
from dlqapp.kafka.transactions import ProducerFactory
from dlqapp.observability.health import MinuteRates
from dlqapp.observability.tracing import Tracing
from dlqapp.processing.caller import BackendCaller
from dlqapp.processing.crashguard import CrashGuard
from dlqapp.processing.pipeline import Pipeline
from dlqapp.processing.spend import Spending
from dlqapp.processing.windows import InFlightWindows
from dlqapp.retries.handover import HandOver
from dlqapp.retries.parked import ParkedRetries
from dlqapp.retries.scheduler import RetryScheduler
from dlqapp.settings import Settings
from dlqapp.tables.counters import Counters
from dlqapp.tables.progress import Progress
from dlqapp.tables.request_store import RequestStore, Send
from dlqapp.tables.retention import Sweeper
from dlqapp.tables.spend_view import SpendView
from dlqapp.tables.steps import StreamSteps
from dlqapp.tables.topology import Topology


@dataclass
class Components:
    """Everything a worker is made of, built once by `build_components`."""

    settings: Settings
    topology: Topology
    steps: StreamSteps
    """Stream steps and, under exactly_once, the open transaction of each owned partition number."""
    acks: Acks
    progress: Progress | None
    """Under exactly_once: where each partition's handling stands, committed with its outputs."""
    clock: Clock
    backend: InferenceBackend
    counters: Counters
    store: RequestStore
    parked: ParkedRetries
    caller: BackendCaller
    dead_letters: DeadLetterWriter
    pipeline: Pipeline
    scheduler: RetryScheduler
    input_gate: InputGate
    recorder: DeadLetterRecorder
    operator: Operator
    crash_guard: CrashGuard
    windows: InFlightWindows
    sweeper: Sweeper
    alerts: AlertBatcher | None
    replay_jobs: ReplayJobs
    oldest_dead_letter: OldestDeadLetter
    rates: MinuteRates
    offsets: OffsetWatch
    tracing: Tracing
    """Spans of attempts and replays (tracing off unless an exporter is configured)."""
    spending: Spending
    """Prices, accounts and admits attempts (money and tenants, docs/costs.md)."""
    spend_view: SpendView
    """Every partition's spend and the budgets set at run time, followed from the stats changelog."""
    tail_read: TailRead | None = None
    """Reads the ends of `input` while the worker is far behind (None: ports give no consumer for it)."""


@dataclass(frozen=True)
class Ports:
    """What a worker's components talk to beyond themselves: Faust's producer, the model
    backend, the due hop's producer, the group's assignment and the time. `build_app` gives
    the real ones; unit tests give in-memory fakes to the same `build_components`."""

    send: Send
    """The plain producer's send (outputs and changelog records under at_least_once)."""
    backend: InferenceBackend
    handover: HandOver
    input_share: Callable[[], float]
    """The fraction of the input partitions this worker owns now (its share of the rate limits)."""
    hand_back: Callable[[Any], None]
    """Gives a consumed event back to the consumer unacked."""
    clock: Clock = now_ms
    new_producer: ProducerFactory | None = None
    """Under exactly_once: makes the transactional producer of a `transactional.id`."""
    span_exporters: tuple[Any, ...] = ()
    """Where spans go (OpenTelemetry span exporters; none: tracing off)."""
    owned_partitions: Callable[[], Iterable[int]] | None = None
    """The table partitions this worker owns now (None: the group's assignment of `stats`)."""
    tail_consumer: Callable[[], TailConsumer] | None = None
    """Makes the consumer that reads the ends of `input` (dlqapp.kafka.tail_read; None: no tail read)."""
    input_partitions: Callable[[], Iterable[int]] = lambda: ()
    """The `input` partitions this worker owns now."""
    input_ends: Ends = lambda partition: None
    """The end of an `input` partition, as the worker's consumer last heard."""
