"""The request path: intake, dedup, the attempt, and carrying out its outcome.

`Pipeline.on_input` takes a fresh request off `input`; `Pipeline.attempt` calls the backend
once (`dlqapp.processing.caller`) and asks `outcomes.decide` what follows;
`Pipeline.carry_out` is the one place an outcome becomes a result, a parked retry
(`dlqapp.retries.parking`) or a dead letter (`dlqapp.deadletters.writer`); a result is
published by `dlqapp.processing.results`. Every send is
confirmed by the broker before the handler returns, so the event is acked only after its
outcome is safe.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import assert_never

from faust import TopicT

from dlqapp.core.budgets import Over, hold_until
from dlqapp.core.clock import Clock
from dlqapp.core.envelope import Attempt, Envelope
from dlqapp.core.errors import ErrorClass
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
from dlqapp.observability import metrics
from dlqapp.observability.tracing import NO_SPAN, AttemptSpan, Tracing
from dlqapp.processing.caller import BackendCaller, Called, NotCalled
from dlqapp.processing.dedup import Dedup
from dlqapp.processing.results import ResultPublisher
from dlqapp.processing.spend import Reservation, Spending
from dlqapp.retries.tier_parking import RetryParking
from dlqapp.tables.request_store import RequestStore

log = logging.getLogger("dlqapp.processing.pipeline")

FALLBACK_LABEL = "fallback"
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
        results: ResultPublisher,
        in_flight: InFlight,
        max_payload_bytes: int,
        max_message_bytes: int,
        clock: Clock,
        after_sent: Callable[[Callable[[], None]], None],
        spending: Spending,
        dedup: Dedup,
        budget_recheck_ms: int,
        rng: random.Random | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        """`after_sent(hook)` runs `hook` once the current step's writes are on their way
        (dlqapp.tables.steps.StreamSteps.after_sent); `dedup` tells a message that must not
        start a chain of its own (dlqapp.processing.dedup); `tracing`: one span per attempt
        (dlqapp.observability.tracing; default: off)."""
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
        self.spending = spending
        self.dedup = dedup
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
        if self.dedup.is_duplicate(request_id, record):
            return
        envelope = Envelope.fresh(
            request_id, record.payload or b"", record.headers, written_ms=record.written_ms, read_from=record.source
        )
        envelope.tenant = self.spending.tenant_of(request, record.headers)
        await self.attempt(envelope, request, topic=record.topic, tier=None, priority=PRIORITIES[request.priority])

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
                replayed=envelope.replayed,
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
                    replayed=envelope.replayed,
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
        metrics.budget_holds.labels(self.spending.tenant_label(tenant), budget).inc()
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
                await self.results.publish(outcome, envelope, request)
            case RetryAt():
                await self.parking.park(outcome, envelope)
            case DeadLetter():
                await self.dead_letters.write(outcome, envelope)
            case _:
                assert_never(outcome)
