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
from typing import Any, Callable, Mapping

from faust import EventT, TopicT
from faust.tables import Table

from dlqapp import metrics
from dlqapp import state as states
from dlqapp.classification import ErrorClass, Failure, classify_exception
from dlqapp.counters import Counters
from dlqapp.flow import PriorityLimiter
from dlqapp.inference import InferenceBackend, InferenceOutput
from dlqapp.logs import log_event
from dlqapp.models import (
    H_ORIGINAL_TIMESTAMP,
    H_SOURCE,
    Attempt,
    Envelope,
    InvalidRequest,
    Request,
    Result,
    fallback_key,
    header_dict,
    header_int,
    now_ms,
    parse_request,
    salvage_request_id,
)
from dlqapp.breaker import BreakerConfig, CircuitBreaker
from dlqapp.outcomes import DeadLetter, RetryAt, RetryPolicy, Succeeded, TryFallback, decide, decide_after_fallback, expiry
from dlqapp.partitioning import owner_partition
from dlqapp.scheduling import Backoff
from dlqapp.settings import Settings

log = logging.getLogger("dlqapp.pipeline")


class Pipeline:
    """Request handling shared by the input agent and the due-retry agent."""

    def __init__(
        self,
        settings: Settings,
        backend: InferenceBackend,
        *,
        tier_topics: list[TopicT],
        dlq_topic: TopicT,
        results_topic: TopicT,
        requests_table: Table,
        counters: Counters,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.policy = RetryPolicy(
            backoff=Backoff(settings.retry_delays_ms, settings.backoff, settings.backoff_jitter),
            retryable=settings.retryable,
            max_age_ms=settings.max_age_ms,
            fallback_model=settings.fallback_model,
        )
        self.breaker = CircuitBreaker(
            BreakerConfig(
                window=settings.breaker_window,
                min_calls=settings.breaker_min_calls,
                failure_ratio=settings.breaker_failure_ratio,
                enabled=settings.breaker_enabled,
                open_ms=settings.breaker_open_ms,
                max_open_ms=settings.breaker_max_open_ms,
                probes=settings.breaker_probes,
            )
        )
        self.limiter = PriorityLimiter(settings.concurrency)
        self.tier_topics = tier_topics
        self.dlq_topic = dlq_topic
        self.results_topic = results_topic
        self.requests = requests_table
        self.counters = counters
        self.in_flight: set[str] = set()
        self.park: Callable[[Envelope, int], None] | None = None
        """Parks a decided retry in the due-time table (set by the wiring: RetryScheduler.store)."""
        self._rng = random.Random()
        self._timeout_s = settings.inference_timeout_ms / 1000

    # -- entry points -----------------------------------------------------------------

    async def on_input(self, event: EventT, topic: TopicT) -> None:
        """Handle one message from `input`."""
        payload: bytes | None = event.value
        try:
            request = parse_request(payload, self.settings.max_payload_bytes)
        except InvalidRequest as exc:
            await self.dead_letter_invalid(event, exc)
            return
        request_id = request.request_id
        if not self.owns(event, request_id):
            await self.forward(event, topic, request_id)
            return
        if self.is_duplicate(request_id, event.message.topic):
            return
        envelope = self.new_envelope(event, request_id, payload or b"")
        await self.attempt(envelope, request, event.message.topic, priority=1)

    def owns(self, event: EventT, request_id: str) -> bool:
        """Whether `event` sits on the partition that owns `request_id`."""
        return event.message.partition == owner_partition(request_id, self.settings.partitions)

    async def forward(self, event: EventT, topic: TopicT, request_id: str) -> None:
        """Re-send a message keyed by its request id to the partition that owns it.

        Producers need not key by request id: this hop makes dedup and state local.
        """
        headers = dict(header_dict(event.headers))
        headers.setdefault(H_ORIGINAL_TIMESTAMP, str(self._event_time_ms(event)))
        headers.setdefault(H_SOURCE, _source_json(event))
        await self.send(topic, request_id, event.value or b"", as_header_pairs(headers))
        log_event(log, logging.DEBUG, "rerouted", request_id=request_id, topic=event.message.topic)

    def is_duplicate(self, request_id: str, source: str) -> bool:
        """True (and counted) when the request already succeeded or is being retried."""
        if request_id in self.in_flight:
            previous = self.load_state(request_id)
            if previous is None:  # first seen moments ago: count it now, its outcome will find this record
                previous = states.transition(None, request_id, states.IN_FLIGHT, now_ms())
                self.counters.add("received")
        else:
            previous = self.load_state(request_id)
            if previous is None or previous["state"] not in states.SETTLED_FOR_DEDUP:
                return False
        self.requests[request_id.encode()] = states.dump(states.count_duplicate(previous, now_ms(), source))
        self.counters.add("duplicates_skipped")
        metrics.duplicates.inc()
        metrics.requests.labels("duplicate_skipped").inc()
        log_event(log, logging.INFO, "duplicate_skipped", request_id=request_id, topic=source, state=previous["state"])
        return True

    def new_envelope(self, event: EventT, request_id: str, payload: bytes) -> Envelope:
        """A fresh envelope for a request first seen in `event` (keeps replay lineage)."""
        envelope = Envelope.from_headers(request_id, payload, event.headers or {})
        envelope.attempts = 0
        envelope.scheduled_time = None
        envelope.error_class = envelope.last_error = None
        envelope.history = []
        headers = header_dict(event.headers)
        envelope.original_timestamp = header_int(headers, H_ORIGINAL_TIMESTAMP) or self._event_time_ms(event)
        if not envelope.source:
            envelope.source = _source(event)
        return envelope

    # -- one attempt ------------------------------------------------------------------

    async def attempt(self, envelope: Envelope, request: Request, topic: str, priority: int) -> None:
        """Attempt the request (unless expired), once more on the fallback if due, and carry out the outcome."""
        expired = expiry(self.policy, envelope.original_timestamp, now_ms())
        if expired is not None:
            await self.carry_out(expired, envelope, request, None)
            return
        self.in_flight.add(request.request_id)
        try:
            number = envelope.attempts + 1
            record, output, failure = await self.call(request, number, topic, envelope.scheduled_time, priority)
            outcome = decide(self.policy, number, failure, output, now_ms(), self._rng)
            if isinstance(outcome, TryFallback):
                envelope.record(record)
                record, output, failure = await self.call(request, number + 1, f"fallback:{outcome.model}", None, priority, outcome.model)
                outcome = decide_after_fallback(outcome.model, failure, output, number + 1)
            await self.carry_out(outcome, envelope, request, record)
        finally:
            self.in_flight.discard(request.request_id)

    async def call(
        self, request: Request, number: int, topic: str, scheduled: int | None, priority: int, model: str | None = None
    ) -> tuple[Attempt, InferenceOutput | None, Failure | None]:
        """One attempt through the breaker and the priority limiter.

        During an outage a fresh request's backend-wide failure is not an attempt: the
        request is held and tried again when the breaker lets it. A request that has
        failed before is never held (see dlqapp.breaker), so holds cannot last forever.
        """
        tier = self.tier_label(topic)
        held = False
        while True:
            rank = number - 1 + int(held)
            await self.breaker.wait_allowed(request.request_id, rank)
            async with self.limiter.slot(priority):
                started = now_ms()
                if scheduled is not None:
                    metrics.lateness.labels(tier).observe(max(0, started - scheduled) / 1000)
                output, failure = await self.call_backend(request, number, model)
            metrics.backend_latency.labels(failure.error_class.value if failure else "ok").observe((now_ms() - started) / 1000)
            if not self.breaker.record(failure, request.request_id, rank):
                break
            held = True
            metrics.held.inc()
            log_event(log, logging.DEBUG, "held_during_outage", request_id=request.request_id, topic=topic, attempt=number, error_class=failure.error_class.value if failure else None)
        metrics.attempts.labels(tier).inc()
        record = Attempt(
            attempt=number,
            at=started,
            topic=topic,
            scheduled=scheduled,
            duration_ms=now_ms() - started,
            error_class=failure.error_class.value if failure else None,
            error=failure.message if failure else None,
        )
        return record, output, failure

    def tier_label(self, topic: str) -> str:
        """A topic name without DLQ_TOPIC_PREFIX; `fallback` for fallback attempts."""
        if topic.startswith("fallback:"):
            return "fallback"
        prefix = self.settings.topic_prefix
        return topic[len(prefix):] if prefix and topic.startswith(prefix) else topic

    async def call_backend(self, request: Request, attempt: int, model: str | None = None) -> tuple[InferenceOutput | None, Failure | None]:
        """One backend call, bounded by DLQ_INFERENCE_TIMEOUT; never raises."""
        try:
            output = await asyncio.wait_for(self.backend.complete(request, attempt, model), self._timeout_s)
        except Exception as exc:  # every failure is classified, nothing escapes
            return None, classify_exception(exc)
        return output, None

    # -- outcomes ---------------------------------------------------------------------

    async def carry_out(self, outcome: Succeeded | RetryAt | DeadLetter, envelope: Envelope, request: Request | None, record: Attempt | None) -> None:
        """Send the outcome to its topic, wait for the broker, then record the state."""
        if record is not None:
            envelope.record(record)
        if isinstance(outcome, Succeeded):
            await self._publish_result(outcome, envelope, request)
        elif isinstance(outcome, RetryAt):
            await self._schedule_retry(outcome, envelope)
        else:
            await self._dead_letter(outcome, envelope)

    async def _publish_result(self, outcome: Succeeded, envelope: Envelope, request: Request | None) -> None:
        at = now_ms()
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
        await self.send(self.results_topic, envelope.request_id, result.to_bytes(), as_header_pairs(envelope.lineage))
        self.set_state(envelope.request_id, states.SUCCEEDED, at, attempts=envelope.attempts, model=output.model)
        metrics.requests.labels("succeeded").inc()
        metrics.end_to_end.observe(max(0, at - envelope.original_timestamp) / 1000)
        log_event(log, logging.DEBUG, "succeeded", request_id=envelope.request_id, attempt=envelope.attempts, model=output.model)

    async def _schedule_retry(self, outcome: RetryAt, envelope: Envelope) -> None:
        envelope.scheduled_time = outcome.due_ms
        topic = self.tier_topics[outcome.tier]
        await self.send(topic, envelope.request_id, envelope.payload, envelope.headers())
        if self.park is not None:
            self.park(envelope, outcome.tier)
        self.set_state(
            envelope.request_id,
            states.RETRY_SCHEDULED,
            now_ms(),
            attempts=envelope.attempts,
            tier=topic.get_topic_name(),
            due=outcome.due_ms,
            error_class=outcome.failure.error_class.value,
            last_error=outcome.failure.message,
        )
        log_event(
            log,
            logging.DEBUG,
            "retry_scheduled",
            request_id=envelope.request_id,
            attempt=envelope.attempts,
            tier=topic.get_topic_name(),
            due=outcome.due_ms,
            error_class=outcome.failure.error_class.value,
        )

    async def _dead_letter(
        self, outcome: DeadLetter, envelope: Envelope, record_state: bool = True, key: str | None = None, partition: int | None = None, **extra: str
    ) -> None:
        at = now_ms()
        envelope.error_class = outcome.error_class.value
        envelope.last_error = envelope.last_error or outcome.reason
        # In the DLQ, retry_count is the number of retries made: attempts - 1.
        headers = envelope.headers(final_error=outcome.reason, dead_at=at, retry_count=max(envelope.attempts - 1, 0), **extra)
        key = key or envelope.request_id
        await self.send(self.dlq_topic, key, envelope.payload, headers, partition=partition)
        if not record_state:
            return
        self.set_state(
            envelope.request_id,
            states.DEAD_LETTERED,
            at,
            attempts=envelope.attempts,
            error_class=outcome.error_class.value,
            final_error=outcome.reason,
        )

    async def dead_letter_invalid(self, event: EventT, exc: InvalidRequest) -> None:
        """Send an invalid message to the DLQ at once, with its original bytes and headers."""
        await self.dead_letter_unprocessable(event, ErrorClass.INVALID_REQUEST, f"invalid request: {exc}", exc.request_id)

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
            key = unprocessable_key(request_id, error_class.value, position)
            owner = request_id
        else:
            key = fallback_key(payload) if error_class is ErrorClass.INVALID_REQUEST else f"{error_class.value}-{position}"
            owner = key
        envelope = Envelope(request_id=request_id or key, payload=payload or b"", original_timestamp=self._event_time_ms(event), source=_source(event))
        envelope.last_error = reason
        extra = {H_ORIGINAL_HEADERS: json.dumps(header_dict(event.headers), separators=(",", ":"))[:MAX_ORIGINAL_HEADERS_CHARS]}
        if payload is None:
            extra["payload_null"] = "true"
        partition = owner_partition(owner, self.settings.partitions)
        await self._dead_letter(DeadLetter(error_class, reason), envelope, record_state=False, key=key, partition=partition, **extra)
        if request_id and partition == message.partition and self.load_state(request_id) is None and request_id not in self.in_flight:
            self.set_state(request_id, states.DEAD_LETTERED, now_ms(), error_class=error_class.value, final_error=reason[:500], dlq_key=key)
        log_event(log, logging.INFO, "unprocessable", request_id=request_id, key=key, error_class=error_class.value, reason=reason[:200])

    # -- Kafka and table helpers ------------------------------------------------------

    async def send(self, topic: TopicT, request_id: str, value: bytes | None, headers: list[tuple[str, bytes]], partition: int | None = None) -> None:
        """Send to the request's owner partition and wait until the broker confirms.

        A None value is a tombstone (used on the compacted `dlq` topic)."""
        if partition is None:
            partition = owner_partition(request_id, self.settings.partitions)
        pending = await topic.send(key=request_id.encode(), value=value, headers=headers, partition=partition)
        await pending

    def load_state(self, request_id: str) -> dict[str, Any] | None:
        return states.load(self.requests.get(request_id.encode()))

    def set_state(self, request_id: str, state: str, at: int, **detail: Any) -> None:
        """Record a settled state (must run inside the owning partition's stream), and count it."""
        previous = self.load_state(request_id)
        new = states.transition(previous, request_id, state, at, **detail)
        self.requests[request_id.encode()] = states.dump(new)
        for name in states.counted(previous, new):
            self.counters.add(name)

    @staticmethod
    def _event_time_ms(event: EventT) -> int:
        timestamp = event.message.timestamp
        return int(timestamp * 1000) if timestamp else now_ms()


H_ORIGINAL_HEADERS = "original_headers"
MAX_ORIGINAL_HEADERS_CHARS = 65536


def unprocessable_key(request_id: str, error_class: str, position: str) -> str:
    """The DLQ key of an invalid or poison message that carries `request_id`."""
    return f"{request_id}~{error_class}~{position}"


def _source(event: EventT) -> dict[str, Any]:
    message = event.message
    return {"topic": message.topic, "partition": message.partition, "offset": message.offset}


def _source_json(event: EventT) -> str:
    return json.dumps(_source(event), separators=(",", ":"))


def as_header_pairs(headers: Mapping[str, str]) -> list[tuple[str, bytes]]:
    """str → str headers as Kafka header pairs."""
    return [(k, v.encode()) for k, v in headers.items()]
