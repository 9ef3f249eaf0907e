"""The request path: intake, dedup, the attempt, and carrying out its outcome.

`Pipeline.on_input` takes a fresh request off `input`; `Pipeline.attempt` calls the backend
once (`dlqapp.processing.caller`) and asks `outcomes.decide` what follows;
`Pipeline.carry_out` is the one place an outcome becomes a result, a parked retry
(`dlqapp.retries.parking`) or a dead letter (`dlqapp.deadletters.writer`). Every send is
confirmed by the broker before the handler returns, so the event is acked only after its
outcome is safe.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import assert_never

from faust import TopicT

from dlqapp.core import states
from dlqapp.core.budgets import Over, hold_until
from dlqapp.core.clock import Clock
from dlqapp.core.envelope import Attempt, Envelope, Result
from dlqapp.core.errors import ErrorClass
from dlqapp.core.headers import H_REPLAY_COUNT, H_SOURCE, header_int
from dlqapp.core.in_flight import InFlight
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
from dlqapp.core.record import Record
from dlqapp.core.requests import InvalidRequest, Request, parse_request, salvage_request_id
from dlqapp.core.tiers import Tier
from dlqapp.deadletters.writer import DeadLetterWriter
from dlqapp.flowcontrol.estimate import estimate_tokens
from dlqapp.flowcontrol.slots import PRIORITIES
from dlqapp.kafka.transaction_errors import RecordTooLarge
from dlqapp.observability import metrics
from dlqapp.observability.logs import log_event
from dlqapp.observability.tracing import NO_SPAN, AttemptSpan, Tracing
from dlqapp.processing.caller import BackendCaller, Called, NotCalled
from dlqapp.processing.spend import Reservation, Spending
from dlqapp.retries.scheduler import RetryParking
from dlqapp.tables.request_store import RequestStore, as_header_pairs

log = logging.getLogger("dlqapp.processing.pipeline")

FALLBACK_LABEL = "fallback"
RESULT_SHRINKS = 40
"""Halvings a result too large for the results topic may take (history first, then its output)."""
INPUT_LABEL = "input"
"""Metric label of first attempts (retries are labelled by their tier)."""


@dataclass(frozen=True, slots=True)
class Admitted:
    """A message from `input` as the door read it (`Pipeline.admit`)."""

    tenant: str
    cost: float
    """Its estimated tokens (prompt and completion budget)."""
    request: Request | None
    invalid: InvalidRequest | None = None


class Pipeline:
    """Request handling shared by the input agent and the due-retry agent."""

    def __init__(
        self,
        caller: BackendCaller,
        policy: RetryPolicy,
        *,
        store: RequestStore,
        parking: RetryParking,
        dead_letters: DeadLetterWriter,
        results: TopicT,
        in_flight: InFlight,
        max_payload_bytes: int,
        max_message_bytes: int,
        clock: Clock,
        after_sent: Callable[[Callable[[], None]], None],
        spending: Spending,
        budget_recheck_ms: int,
        redelivery_by_time: bool = False,
        rng: random.Random | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """`after_sent(hook)` runs `hook` once the current step's writes are on their way
        (dlqapp.tables.steps.StreamSteps.after_sent); `redelivery_by_time`: take a message
        written before its request was first seen for a redelivery (at_least_once);
        `tracing`: one span per attempt (dlqapp.observability.tracing; default: off)."""
        self.caller = caller
        self.policy = policy
        self.store = store
        self.parking = parking
        self.dead_letters = dead_letters
        self.results = results
        self.in_flight = in_flight
        self.max_payload_bytes = max_payload_bytes
        self.max_message_bytes = max_message_bytes
        self.clock = clock
        self.after_sent = after_sent
        self.redelivery_by_time = redelivery_by_time
        self.spending = spending
        self.budget_recheck_ms = budget_recheck_ms
        self._rng = rng or random.Random()
        self.tracing = tracing or Tracing()

    # -- intake -----------------------------------------------------------------------

    def admit(self, record: Record) -> Admitted:
        """Read a message from `input` once, at the door: its request (or why it is none), its
        tenant and its estimated tokens, for the input feed's fair queuing."""
        try:
            request = parse_request(record.payload, self.max_payload_bytes)
        except InvalidRequest as exc:
            return Admitted(self.spending.default_tenant, 1.0, None, exc)
        return Admitted(self.spending.tenant_of(request, record.headers), float(estimate_tokens(request)), request)

    async def on_input(self, record: Record, topic: TopicT, admitted: Admitted | None = None) -> None:
        """Handle one message from `input` (`admitted`: what the door read of it, else read now)."""
        admitted = admitted or self.admit(record)
        try:
            if admitted.invalid is not None:
                raise admitted.invalid
            request = admitted.request
            assert request is not None
        except InvalidRequest as exc:
            request_id = exc.request_id or salvage_request_id(record.payload)  # an oversized one's too
            if (
                request_id
                and record.payload is not None
                and not self.store.owns(record, request_id)
                and self.store.fits_forward(record, request_id, self.max_message_bytes)
            ):
                # judged where its id's state lives (a copy of a live request, or the request itself)
                await self.store.forward(record, topic, request_id)
                return
            await self.dead_letters.write_unprocessable(
                record, ErrorClass.INVALID_REQUEST, f"invalid request: {exc}", request_id=request_id
            )
            return
        request_id = request.request_id
        if not self.store.owns(record, request_id):
            if not self.store.fits_forward(record, request_id, self.max_message_bytes):
                reason = (
                    f"too large ({len(record.payload or b'')} bytes) to re-send keyed by its request id to the "
                    "partition that owns it (within DLQ_MAX_MESSAGE_BYTES); send it keyed by its request_id"
                )
                await self.dead_letters.write_unprocessable(
                    record, ErrorClass.INVALID_REQUEST, reason, request_id=request_id
                )
                return
            await self.store.forward(record, topic, request_id)
            return
        if self.is_duplicate(request_id, record):
            return
        envelope = Envelope.fresh(
            request_id, record.payload or b"", record.headers, written_ms=record.written_ms, read_from=record.source
        )
        envelope.tenant = self.spending.tenant_of(request, record.headers)
        await self.attempt(envelope, request, topic=record.topic, tier=None, priority=PRIORITIES[request.priority])

    def is_duplicate(self, request_id: str, record: Record) -> bool:
        """True (and counted) when this message must not start an attempt chain of its own
        (docs/how-it-works.md, Dedup):

        - an attempt of the request is running here, or its retry is parked, or it succeeded;
        - an operator's replay of it is on its way and this message is not that replay;
        - under at_least_once only, the message was written before the request was first
          seen (the same message again, redelivered after a crash). Under exactly_once a
          redelivered message never gets here: its outputs committed with the partition's
          progress, and the door skips it (dlqapp.tables.progress), whatever the clocks say.

        A request the table says is in flight, but that no attempt here is running, is not a
        duplicate: its attempt died with its worker or its partition, and nothing else would
        end it. Nor is a request dead-lettered or discarded: a new copy is a new chain."""
        previous = self.store.load_state(request_id)
        if request_id in self.in_flight:
            if previous is None:  # first seen moments ago: count it now, its outcome will find this record
                previous = states.transition(None, request_id, states.IN_FLIGHT, self.clock())
                self.store.counters.add("received")
        elif previous is None or previous.state == states.IN_FLIGHT:
            return False
        elif previous.state == states.REPROCESSED:
            if (header_int(record.headers, H_REPLAY_COUNT) or 0) == previous.replay_count:
                return False  # the replay itself
        elif previous.state not in states.SETTLED_FOR_DEDUP and not (
            self.redelivery_by_time and record.written_ms <= previous.first_seen
        ):
            return False
        self.store.store_state(request_id, states.count_duplicate(previous, self.clock(), record.topic))
        self.store.counters.add("duplicates_skipped")
        metrics.duplicates.inc()
        metrics.requests.labels("duplicate_skipped").inc()
        log_event(
            log, logging.INFO, "duplicate_skipped", request_id=request_id, topic=record.topic, state=previous.state
        )
        return True

    def already_succeeded(self, record: Record) -> bool:
        """The request this message carries (by the id in its payload) has a result already."""
        request_id = salvage_request_id(record.payload)
        if not request_id or self.store.owner(request_id) != record.partition:
            return False
        state = self.store.load_state(request_id)
        return state is not None and state.state == states.SUCCEEDED

    # -- one attempt ------------------------------------------------------------------

    async def attempt(
        self,
        envelope: Envelope,
        request: Request,
        *,
        topic: str,
        tier: Tier | None,
        priority: int,
        not_before: int | None = None,
    ) -> None:
        """Attempt the request (unless expired), once more on the fallback if due, and carry out the outcome.

        `topic` is where the attempt came from (for the history); `tier` the retry tier, None
        for input; `not_before` (epoch ms) a time the call must not start before, its backend
        slot held meanwhile (a due retry taking its slot ahead of its due time). The attempt
        is a span of the request's trace (dlqapp.observability.tracing), begun here.
        """
        span = self.tracing.attempt(envelope, tier=tier.label if tier else INPUT_LABEL, model=request.model)
        try:
            await self._attempt(
                envelope, request, span, topic=topic, tier=tier, priority=priority, not_before=not_before
            )
        except BaseException as exc:
            span.failed(exc)
            raise
        finally:
            span.end()

    async def _attempt(
        self,
        envelope: Envelope,
        request: Request,
        span: AttemptSpan,
        *,
        topic: str,
        tier: Tier | None,
        priority: int,
        not_before: int | None,
    ) -> None:
        expired = expiry(self.policy, envelope.original_timestamp, self.clock()) or past_deadline(
            request.deadline, self.clock()
        )
        if expired is not None:
            await self.carry_out(expired, envelope, request, record=None, span=span)
            return
        self.in_flight.add(request.request_id)
        tenant = envelope.tenant = envelope.tenant or self.spending.tenant_of(request, {})
        admitted = await self.spending.admit(request, tenant, self.spending.model_of(request))
        if not isinstance(admitted, Reservation):  # over its budget: held, no attempt spent
            try:
                await self._hold(envelope, request, tenant, admitted)
            finally:
                self.after_sent(lambda: self.in_flight.discard(request.request_id))
            return
        reservation = admitted

        def idle() -> None:
            self.in_flight.discard(request.request_id)
            reservation.release()

        try:
            number = envelope.attempts + 1
            label = tier.label if tier else INPUT_LABEL
            called = await self.caller.call(
                request,
                number=number,
                topic=topic,
                label=label,
                due_ms=envelope.due_ms,
                priority=priority,
                not_before=not_before,
                tenant=tenant,
            )
            if isinstance(called, NotCalled):  # its deadline passed while it waited
                await self.carry_out(called.outcome, envelope, request, record=None, span=span)
                return
            self._spent(called, request, tenant)
            outcome = within_deadline(
                decide(self.policy, number, called.failure, output=called.output, now_ms=self.clock(), rng=self._rng),
                request.deadline,
            )
            if isinstance(outcome, TryFallback):
                envelope.record(called.attempt)
                span.fall_back(called.attempt, envelope, model=outcome.model)
                called = await self.caller.call(
                    request,
                    number=number + 1,
                    topic=f"fallback:{outcome.model}",
                    label=FALLBACK_LABEL,
                    due_ms=None,
                    priority=priority,
                    model=outcome.model,
                    tenant=tenant,
                )
                if isinstance(called, NotCalled):
                    await self.carry_out(called.outcome, envelope, request, record=None, span=span)
                    return
                self._spent(called, request, tenant, outcome.model)
                outcome = decide_after_fallback(
                    outcome.model, called.failure, output=called.output, attempts=number + 1
                )
            await self.carry_out(outcome, envelope, request, record=called.attempt, span=span)
        finally:
            # idle once this step's writes are on their way: the next attempt's must follow them;
            # by then its cost is in the partition's counts, so its reservation can go
            self.after_sent(idle)

    def _spent(self, called: Called, request: Request, tenant: str, model: str | None = None) -> None:
        """Price the attempt's tokens and count them, in this step (dlqapp.processing.spend)."""
        self.spending.price(called.attempt, request, called.output, called.failure, model)
        self.spending.account(called.attempt, tenant)

    async def _hold(self, envelope: Envelope, request: Request, tenant: str, over: Over | None) -> None:
        """Park the request until its budget may have room again (dlqapp.core.budgets.hold_until)."""
        now = self.clock()
        reason = over.reason() if over is not None else "the cluster's spend is not read yet"
        budget = f"{over.scope}:{over.window}" if over is not None else "unknown"
        metrics.budget_holds.labels(tenant, budget).inc()
        await self.parking.hold(envelope, hold_until(now, self.budget_recheck_ms, request.deadline), reason, tenant)

    # -- outcomes ---------------------------------------------------------------------

    async def carry_out(
        self,
        outcome: Succeeded | RetryAt | DeadLetter,
        envelope: Envelope,
        request: Request | None,
        *,
        record: Attempt | None,
        span: AttemptSpan = NO_SPAN,
    ) -> None:
        """Send the outcome to its topic, wait for the broker, then record the state (and tell
        the attempt's `span` how it ended)."""
        span.outcome(outcome, record)
        if record is not None:
            envelope.record(record)
        match outcome:
            case Succeeded():
                await self._publish_result(outcome, envelope, request)
            case RetryAt():
                await self.parking.park(outcome, envelope)
            case DeadLetter():
                await self.dead_letters.write(outcome, envelope)
            case _:
                assert_never(outcome)

    async def _send_result(self, result: Result, headers: list[tuple[str, bytes]]) -> None:
        """Publish `result`; one larger than the topic holds loses its history, then half its
        output at a time (`output_truncated`): the call was paid for, its answer must land."""
        for _ in range(RESULT_SHRINKS):
            try:
                await self.store.send(self.results, result.request_id, result.to_bytes(), headers)
                return
            except RecordTooLarge:
                if result.history:
                    result.history = None
                else:
                    result.output_bytes = result.output_bytes or len(result.output.encode())
                    result.output = result.output[: len(result.output) // 2]
        raise RecordTooLarge(f"the result of {result.request_id} does not fit the results topic")

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
            spent=envelope.spent,
            tenant=envelope.tenant,
        )
        headers = {**envelope.lineage, H_SOURCE: json.dumps(envelope.source, separators=(",", ":"))}
        await self._send_result(result, as_header_pairs(headers))
        self.store.set_state(
            envelope.request_id,
            states.SUCCEEDED,
            at,
            attempts=envelope.attempts,
            model=output.model,
            attempt_log=envelope.history,
        )
        metrics.requests.labels("succeeded").inc()
        metrics.end_to_end.observe(max(0, at - envelope.original_timestamp) / 1000)
        log_event(
            log,
            logging.DEBUG,
            "succeeded",
            request_id=envelope.request_id,
            attempt=envelope.attempts,
            model=output.model,
        )
