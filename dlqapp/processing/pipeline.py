"""The request path: validate, dedup, attempt, and carry out the outcome.

`Pipeline.attempt` calls the backend once and asks `outcomes.decide` what follows;
`Pipeline.carry_out` is the one place an outcome becomes a Kafka send
(results, a retry tier, or the DLQ) and a state change. Every send is confirmed by the
broker before the handler returns, so the event is acked only after its outcome is safe.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import assert_never

from faust import EventT, TopicT

from dlqapp.core import states
from dlqapp.core.breaker import CircuitBreaker
from dlqapp.core.clock import Clock, sleep_until
from dlqapp.core.envelope import Attempt, Envelope, Result
from dlqapp.core.errors import ErrorClass, Failure, classify_exception
from dlqapp.core.headers import (
    H_ORIGINAL_HEADERS,
    H_ORIGINAL_TIMESTAMP,
    H_PAYLOAD_NULL,
    header_dict,
    header_int,
)
from dlqapp.core.outcomes import (
    DeadLetter,
    RetryAt,
    RetryPolicy,
    Succeeded,
    TryFallback,
    decide,
    decide_after_fallback,
    expiry,
    past_deadline,
    within_deadline,
)
from dlqapp.core.requests import (
    InvalidRequest,
    Request,
    fallback_key,
    parse_request,
    salvage_request_id,
)
from dlqapp.core.tiers import Tier
from dlqapp.deadletters.entries import unprocessable_key
from dlqapp.flowcontrol.aimd import pushed_back
from dlqapp.flowcontrol.estimate import estimate_tokens, used_tokens
from dlqapp.flowcontrol.gate import UNLIMITED, Permit, RateGate
from dlqapp.flowcontrol.limits import RateLimits
from dlqapp.flowcontrol.slots import PRIORITIES
from dlqapp.inference import InferenceBackend, InferenceOutput
from dlqapp.observability import metrics
from dlqapp.observability.lateness import LatenessWindow
from dlqapp.observability.logs import log_event
from dlqapp.retries.parked import ParkedRetries
from dlqapp.processing.flow import PriorityLimiter
from dlqapp.processing.partition_io import PartitionIO, as_header_pairs, source_of

log = logging.getLogger("dlqapp.processing.pipeline")

MAX_ORIGINAL_HEADERS_CHARS = 65536
FALLBACK_LABEL = "fallback"
INPUT_LABEL = "input"
"""Metric label of first attempts (retries are labelled by their tier)."""


class DeadlinePassed(Exception):
    """The request's deadline passed before its call could be made."""

    def __init__(self, outcome: DeadLetter) -> None:
        super().__init__(outcome.reason)
        self.outcome = outcome


@dataclass(frozen=True)
class Outlets:
    """Where outcomes go: one topic per retry tier, `dlq`, `results`."""

    tiers: tuple[tuple[Tier, TopicT], ...]
    dlq: TopicT
    results: TopicT


LATE_WARNING_MS = 5_000
"""A retry that starts this long after its due time is logged as a warning: something held it."""


class Pipeline:
    """Request handling shared by the input agent and the due-retry agent."""

    def __init__(
        self,
        backend: InferenceBackend,
        policy: RetryPolicy,
        breaker: CircuitBreaker,
        limiter: PriorityLimiter,
        *,
        io: PartitionIO,
        parked: ParkedRetries,
        outlets: Outlets,
        max_payload_bytes: int,
        timeout_ms: int,
        clock: Clock,
        lateness: LatenessWindow,
        rng: random.Random | None = None,
        gate: RateGate | None = None,
    ) -> None:
        self.backend = backend
        self.gate = gate or RateGate(RateLimits({}))
        self.policy = policy
        self.breaker = breaker
        self.limiter = limiter
        self.io = io
        self.parked = parked
        self.outlets = outlets
        self.max_payload_bytes = max_payload_bytes
        self.clock = clock
        self.lateness = lateness
        self.in_flight: set[str] = set()
        self._idle_waiters: dict[str, asyncio.Event] = {}
        self._rng = rng or random.Random()
        self._timeout_s = timeout_ms / 1000

    # -- entry points -----------------------------------------------------------------

    async def on_input(self, event: EventT, topic: TopicT) -> None:
        """Handle one message from `input`."""
        payload: bytes | None = event.value
        try:
            request = parse_request(payload, self.max_payload_bytes)
        except InvalidRequest as exc:
            await self.dead_letter_invalid(event, exc)
            return
        request_id = request.request_id
        if not self.io.owns(event, request_id):
            await self.io.forward(event, topic, request_id)
            return
        if self.is_duplicate(request_id, event.message.topic, self.message_time_ms(event)):
            return
        envelope = self.new_envelope(event, request_id, payload or b"")
        await self.attempt(envelope, request, event.message.topic, None, priority=PRIORITIES[request.priority])

    def is_duplicate(self, request_id: str, source: str, message_time_ms: int | None = None) -> bool:
        """True (and counted) when the request is in flight, being retried or succeeded, or
        when this message was written before the request was first seen (the same message
        again, redelivered after a crash; only a copy sent later is a new request)."""
        previous = self.io.load_state(request_id)
        if request_id in self.in_flight:
            if previous is None:  # first seen moments ago: count it now, its outcome will find this record
                previous = states.transition(None, request_id, states.IN_FLIGHT, self.clock())
                self.io.counters.add("received")
        elif previous is None:
            return False
        elif previous["state"] not in states.SETTLED_FOR_DEDUP and not (message_time_ms is not None and message_time_ms <= previous.get("first_seen", -1)):
            return False
        self.io.store_state(request_id, states.count_duplicate(previous, self.clock(), source))
        self.io.counters.add("duplicates_skipped")
        metrics.duplicates.inc()
        metrics.requests.labels("duplicate_skipped").inc()
        log_event(log, logging.INFO, "duplicate_skipped", request_id=request_id, topic=source, state=previous["state"])
        return True

    def message_time_ms(self, event: EventT) -> int:
        """When the request's message was first written: its `original_timestamp` header
        (set when dlqapp re-sends it to the owning partition, or by a replay) or its Kafka time."""
        return header_int(header_dict(event.headers), H_ORIGINAL_TIMESTAMP) or self.io.event_time_ms(event)

    def new_envelope(self, event: EventT, request_id: str, payload: bytes) -> Envelope:
        """A fresh envelope for a request first seen in `event` (keeps replay lineage)."""
        envelope = Envelope.from_headers(request_id, payload, event.headers or {})
        envelope.attempts = 0
        envelope.scheduled_time = None
        envelope.error_class = envelope.last_error = None
        envelope.history = []
        envelope.original_timestamp = self.message_time_ms(event)
        if not envelope.source:
            envelope.source = source_of(event)
        return envelope

    # -- one attempt ------------------------------------------------------------------

    async def attempt(self, envelope: Envelope, request: Request, topic: str, tier: Tier | None, priority: int, not_before: int | None = None) -> None:
        """Attempt the request (unless expired), once more on the fallback if due, and carry out the outcome.

        `topic` is where the attempt came from (for the history); `tier` the retry tier, None
        for input; `not_before` (epoch ms) a time the call must not start before, its backend
        slot held meanwhile (a due retry taking its slot ahead of its due time).
        """
        expired = expiry(self.policy, envelope.original_timestamp, self.clock()) or past_deadline(request.deadline, self.clock())
        if expired is not None:
            await self.carry_out(expired, envelope, request, None)
            return
        self.in_flight.add(request.request_id)
        try:
            number = envelope.attempts + 1
            label = tier.label if tier else INPUT_LABEL
            try:
                record, output, failure = await self.call(request, number, topic, label, envelope.scheduled_time, priority, not_before=not_before)
                outcome = within_deadline(decide(self.policy, number, failure, output, self.clock(), self._rng), request.deadline)
                if isinstance(outcome, TryFallback):
                    envelope.record(record)
                    record, output, failure = await self.call(request, number + 1, f"fallback:{outcome.model}", FALLBACK_LABEL, None, priority, outcome.model)
                    outcome = decide_after_fallback(outcome.model, failure, output, number + 1)
            except DeadlinePassed as passed:  # while waiting for capacity, the breaker or a slot
                await self.carry_out(passed.outcome, envelope, request, None)
                return
            await self.carry_out(outcome, envelope, request, record)
        finally:
            self.in_flight.discard(request.request_id)
            waiter = self._idle_waiters.pop(request.request_id, None)
            if waiter is not None:
                waiter.set()

    async def wait_until_idle(self, request_id: str, timeout_s: float) -> bool:
        """Wait until no attempt of the request runs here (its previous attempt may still be
        finishing its step when its retry is handed over early); False after `timeout_s`."""
        if request_id not in self.in_flight:
            return True
        waiter = self._idle_waiters.setdefault(request_id, asyncio.Event())
        try:
            await asyncio.wait_for(waiter.wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return request_id not in self.in_flight

    async def call(
        self, request: Request, number: int, topic: str, label: str, scheduled: int | None, priority: int, model: str | None = None, not_before: int | None = None
    ) -> tuple[Attempt, InferenceOutput | None, Failure | None]:
        """One attempt through the breaker and the priority limiter.

        During an outage a fresh request's backend-wide failure is not an attempt: the
        request is held and tried again when the breaker lets it. A request that has
        failed before is never held (see dlqapp.core.breaker), so holds cannot last forever.
        """
        held = False
        while True:
            rank = number - 1 + int(held)
            await self.breaker.wait_allowed(request.request_id, rank)
            try:
                target = model or request.model
                if self.gate.is_limited(target):
                    async with AsyncExitStack() as slot:  # the backend slot, taken by the gate once the model has room
                        permit = await self.gate.acquire(
                            target, estimate_tokens(request), self._time_left_s(request), priority, lambda: slot.enter_async_context(self.limiter.slot(priority))
                        )
                        if permit is None:
                            raise DeadlinePassed(DeadLetter(ErrorClass.EXPIRED, f"deadline {request.deadline} passed while waiting for rate capacity; not called"))
                        started, output, failure = await self._call_in_slot(request, number, label, scheduled, model, not_before, permit)
                else:
                    async with self.limiter.slot(priority):
                        started, output, failure = await self._call_in_slot(request, number, label, scheduled, model, not_before, UNLIMITED)
            except BaseException:  # cancelled, or past its deadline: the breaker must get its probe back
                self.breaker.abandon(request.request_id)
                raise
            metrics.backend_latency.labels(failure.error_class.value if failure else "ok").observe((self.clock() - started) / 1000)
            if not self.breaker.record(failure, request.request_id, rank):
                break
            held = True
            metrics.held.inc()
            log_event(log, logging.DEBUG, "held_during_outage", request_id=request.request_id, topic=topic, attempt=number)
        metrics.attempts.labels(label).inc()
        record = Attempt(
            attempt=number,
            at=started,
            topic=topic,
            scheduled=scheduled,
            duration_ms=self.clock() - started,
            error_class=failure.error_class.value if failure else None,
            error=failure.message if failure else None,
        )
        return record, output, failure

    async def _call_in_slot(
        self, request: Request, number: int, label: str, scheduled: int | None, model: str | None, not_before: int | None, permit: Permit
    ) -> tuple[int, InferenceOutput | None, Failure | None]:
        """The call itself, holding a backend slot: (when it started, output, failure)."""
        if not_before is not None:
            await sleep_until(self.clock, not_before)  # the slot is held meanwhile
        started = self.clock()
        expired = past_deadline(request.deadline, started)
        if expired is not None:
            raise DeadlinePassed(expired)
        if scheduled is not None:
            metrics.lateness.labels(label).observe(max(0, started - scheduled) / 1000)
            self.lateness.add(label, started - scheduled, started)
            if started - scheduled > LATE_WARNING_MS:
                log_event(log, logging.WARNING, "retry_late", request_id=request.request_id, tier=label, attempt=number, late_ms=started - scheduled, scheduled=scheduled)
        output, failure = await self.call_backend(request, number, model)
        self.after_call(model or request.model, permit, output, failure, (self.clock() - started) / 1000)
        return started, output, failure

    def _time_left_s(self, request: Request) -> float | None:
        """How long the request may still wait for capacity (None: no deadline)."""
        return None if request.deadline is None else max(0.0, (request.deadline - self.clock()) / 1000)

    def after_call(self, model: str | None, permit: Permit, output: InferenceOutput | None, failure: Failure | None, latency_s: float) -> None:
        """Feed flow control: the real token usage, a 429's Retry-After, adaptive concurrency."""
        if output is not None:
            permit.settle(used_tokens(output.usage))
        elif failure is not None and failure.error_class is ErrorClass.RATE_LIMITED:
            permit.settle(0)  # refused: it used no tokens
            if failure.retry_after_ms:
                self.gate.pause(model, failure.retry_after_ms / 1000)
        self.limiter.record(latency_s, pushed_back(failure, latency_s, self._timeout_s, self.limiter.is_slow))

    async def call_backend(self, request: Request, attempt: int, model: str | None = None) -> tuple[InferenceOutput | None, Failure | None]:
        """One backend call, bounded by DLQ_INFERENCE_TIMEOUT; never raises."""
        try:
            async with asyncio.timeout(self._timeout_s):
                output = await self.backend.complete(request, attempt, model)
        except Exception as exc:  # every failure is classified, nothing escapes
            return None, classify_exception(exc)
        return output, None

    # -- outcomes ---------------------------------------------------------------------

    async def carry_out(self, outcome: Succeeded | RetryAt | DeadLetter, envelope: Envelope, request: Request | None, record: Attempt | None) -> None:
        """Send the outcome to its topic, wait for the broker, then record the state."""
        if record is not None:
            envelope.record(record)
        match outcome:
            case Succeeded():
                await self._publish_result(outcome, envelope, request)
            case RetryAt():
                await self._schedule_retry(outcome, envelope)
            case DeadLetter():
                await self._dead_letter(outcome, envelope)
            case _:
                assert_never(outcome)

    async def _publish_result(self, outcome: Succeeded, envelope: Envelope, request: Request | None) -> None:
        at = self.clock()
        output = outcome.output
        result = Result(
            request_id=envelope.request_id,
            model=output.model,
            output=output.text,
            attempts=envelope.attempts,
            latency_ms=at - envelope.original_timestamp,
            completed_at=at,
            metadata=request.metadata if request else {},
            usage=output.usage or None,
            history=envelope.history,
        )
        await self.io.send(self.outlets.results, envelope.request_id, result.to_bytes(), as_header_pairs(envelope.lineage))
        self.io.set_state(envelope.request_id, states.SUCCEEDED, at, attempts=envelope.attempts, model=output.model, attempt_log=envelope.history)
        metrics.requests.labels("succeeded").inc()
        metrics.end_to_end.observe(max(0, at - envelope.original_timestamp) / 1000)
        log_event(log, logging.DEBUG, "succeeded", request_id=envelope.request_id, attempt=envelope.attempts, model=output.model)

    async def _schedule_retry(self, outcome: RetryAt, envelope: Envelope) -> None:
        envelope.scheduled_time = outcome.due_ms
        tier, topic = self.outlets.tiers[outcome.tier]
        await self.io.send(topic, envelope.request_id, envelope.payload, envelope.headers())
        self.parked.store(envelope, tier)
        failure = outcome.failure
        self.io.set_state(
            envelope.request_id,
            states.RETRY_SCHEDULED,
            self.clock(),
            attempts=envelope.attempts,
            tier=tier.topic,
            due=outcome.due_ms,
            error_class=failure.error_class.value,
            last_error=failure.message,
        )
        log_event(log, logging.DEBUG, "retry_scheduled", request_id=envelope.request_id, attempt=envelope.attempts, tier=tier.label, due=outcome.due_ms, error_class=failure.error_class.value)

    async def _dead_letter(
        self, outcome: DeadLetter, envelope: Envelope, record_state: bool = True, key: str | None = None, partition: int | None = None, **extra: str
    ) -> None:
        at = self.clock()
        envelope.error_class = outcome.error_class.value
        envelope.last_error = envelope.last_error or outcome.reason
        # In the DLQ, retry_count is the number of retries made: attempts - 1.
        headers = envelope.headers(final_error=outcome.reason, dead_at=at, retry_count=max(envelope.attempts - 1, 0), **extra)
        await self.io.send(self.outlets.dlq, key or envelope.request_id, envelope.payload, headers, partition=partition)
        if record_state:
            self.io.set_state(envelope.request_id, states.DEAD_LETTERED, at, attempts=envelope.attempts, error_class=outcome.error_class.value, final_error=outcome.reason)

    async def dead_letter_invalid(self, event: EventT, exc: InvalidRequest) -> None:
        """Send an invalid message to the DLQ at once, with its original bytes and headers."""
        await self.dead_letter_unprocessable(event, ErrorClass.INVALID_REQUEST, f"invalid request: {exc}", exc.request_id)

    def already_succeeded(self, event: EventT) -> bool:
        """The request this message carries (by the id in its payload) has a result already."""
        payload = event.message.value if isinstance(event.message.value, (bytes, type(None))) else None
        request_id = salvage_request_id(payload)
        if not request_id or self.io.owner(request_id) != event.message.partition:
            return False
        state = self.io.load_state(request_id)
        return bool(state) and state.get("state") == states.SUCCEEDED

    async def dead_letter_unprocessable(self, event: EventT, error_class: ErrorClass, reason: str, request_id: str | None = None) -> None:
        """Dead-letter a message dlqapp cannot handle (invalid, or `poison`: its handler failed).

        Its DLQ key is its own (`<request id>~<class>~<digest of its position>`), so it
        never replaces another dead letter of the same request id on the compacted
        `dlq` topic; it sits on that id's partition and `GET /dlq/<request id>/` finds
        it. It changes a request's state only when the id was never seen before: an
        invalid copy of a request that succeeded, is being retried or is in flight
        leaves it as it is.
        """
        message = event.message
        payload = message.value if isinstance(message.value, (bytes, type(None))) else None  # the bytes as they came
        request_id = request_id or salvage_request_id(payload)
        position = hashlib.sha256(f"{message.topic}:{message.partition}:{message.offset}".encode()).hexdigest()[:12]
        if request_id:
            key, owner = unprocessable_key(request_id, error_class.value, position), request_id
        else:
            key = fallback_key(payload) if error_class is ErrorClass.INVALID_REQUEST else f"{error_class.value}-{position}"
            owner = key
        envelope = Envelope(request_id=request_id or key, payload=payload or b"", original_timestamp=self.io.event_time_ms(event), source=source_of(event))
        envelope.last_error = reason
        extra = {H_ORIGINAL_HEADERS: json.dumps(header_dict(event.headers), separators=(",", ":"))[:MAX_ORIGINAL_HEADERS_CHARS]}
        if payload is None:
            extra[H_PAYLOAD_NULL] = "true"
        partition = self.io.owner(owner)
        await self._dead_letter(DeadLetter(error_class, reason), envelope, record_state=False, key=key, partition=partition, **extra)
        if request_id and partition == message.partition and self.io.load_state(request_id) is None and request_id not in self.in_flight:
            self.io.set_state(request_id, states.DEAD_LETTERED, self.clock(), error_class=error_class.value, final_error=reason[:500], dlq_key=key)
        elif not request_id:
            self.io.counters.add("received")  # no id to keep a state under, but it did arrive
        log_event(log, logging.INFO, "unprocessable", request_id=request_id, key=key, error_class=error_class.value, reason=reason[:200])
