"""One backend call, through the circuit breaker, the rate gate and a backend slot.

The caller never raises for a failed call: every exception is classified into a
`Failure`. It feeds flow control with what the call showed (token usage, a 429's
Retry-After, latency for the adaptive limit) and records retry lateness.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass

from dlqapp.core.backend import InferenceBackend, InferenceOutput
from dlqapp.core.breaker import CircuitBreaker
from dlqapp.core.clock import Clock
from dlqapp.core.envelope import Attempt
from dlqapp.core.errors import ErrorClass, Failure, classify_exception
from dlqapp.core.outcomes import DeadLetter, past_deadline
from dlqapp.core.requests import Request
from dlqapp.flowcontrol.aimd import pushed_back
from dlqapp.flowcontrol.estimate import estimate_tokens, used_tokens
from dlqapp.flowcontrol.gate import UNLIMITED, Permit, RateGate
from dlqapp.flowcontrol.limits import RateLimits
from dlqapp.flowcontrol.slots import SlotLimiter
from dlqapp.observability import metrics
from dlqapp.observability.lateness import LatenessWindow
from dlqapp.observability.logs import log_event
from dlqapp.tables.step import Step, StepContext

log = logging.getLogger("dlqapp.processing.caller")

LATE_WARNING_MS = 5_000
"""A retry that starts this long after its due time is logged as a warning: something held it."""


@dataclass(frozen=True, slots=True)
class Called:
    """One attempt's call was made: its history entry, and its output or its failure."""

    attempt: Attempt
    output: InferenceOutput | None
    failure: Failure | None


@dataclass(frozen=True, slots=True)
class NotCalled:
    """The request's deadline passed while its call waited (for the breaker, rate capacity or a
    slot): it was never called, and this dead letter is its outcome."""

    outcome: DeadLetter


CallResult = Called | NotCalled


@dataclass(frozen=True, slots=True)
class _Made:
    started: int
    output: InferenceOutput | None
    failure: Failure | None


class BackendCaller:
    """Makes one attempt's backend call when the breaker, the rate gate and a slot allow."""

    def __init__(
        self,
        backend: InferenceBackend,
        breaker: CircuitBreaker,
        limiter: SlotLimiter,
        *,
        timeout_ms: int,
        clock: Clock,
        lateness: LatenessWindow,
        gate: RateGate | None = None,
        steps: StepContext | None = None,
    ) -> None:
        """`steps`: where the calling step is found, to mark it waiting until its call starts
        (a release hands a waiting step's event back at once, see InFlightWindow.release)."""
        self.backend = backend
        self.breaker = breaker
        self.limiter = limiter
        self.gate = gate or RateGate(RateLimits({}))
        self.clock = clock
        self.lateness = lateness
        self.steps = steps
        self._timeout_s = timeout_ms / 1000

    async def call(
        self,
        request: Request,
        *,
        number: int,
        topic: str,
        label: str,
        due_ms: int | None,
        priority: int,
        model: str | None = None,
        not_before: int | None = None,
        tenant: str = "",
        replayed: bool = False,
    ) -> CallResult:
        """Attempt `number` of `request` through the breaker and the priority limiter.

        `topic` is where the attempt came from (for its history entry), `label` its metric
        label, `due_ms` the due time of a retry, `model` a model other than the request's (the
        fallback), `not_before` a time the call must not start before (its slot held meanwhile),
        `tenant` whose call it is (backend slots are shared between tenants fairly),
        `replayed` a dead letter sent back by an operator (it has failed before).

        During an outage a fresh request's backend-wide failure is not an attempt: the
        request is held and tried again when the breaker lets it. A request that has
        failed before is never held (see dlqapp.core.breaker), so holds cannot last forever.
        A replayed dead letter has failed before, though its attempts start again at 1.
        """
        held = False
        while True:
            rank = number - 1 + int(held) + int(replayed)
            self._waiting(True)
            try:
                await self.breaker.wait_allowed(request.request_id, rank)
                try:
                    made = await self._call_with_capacity(
                        request, number, label, due_ms, priority, model, not_before, tenant
                    )
                except BaseException:  # cancelled: the breaker must get its probe back
                    self.breaker.abandon(request.request_id)
                    raise
            finally:
                self._waiting(False)
            if isinstance(made, NotCalled):
                self.breaker.abandon(request.request_id)
                return made
            started, output, failure = made.started, made.output, made.failure
            metrics.backend_latency.labels(failure.error_class.value if failure else "ok").observe(
                (self.clock() - started) / 1000
            )
            if not self.breaker.record(failure, request.request_id, rank):
                break
            held = True
            metrics.held.inc()
            log_event(
                log, logging.DEBUG, "held_during_outage", request_id=request.request_id, topic=topic, attempt=number
            )
        self._called()
        metrics.attempts.labels(label).inc()
        attempt = Attempt(
            attempt=number,
            at=started,
            topic=topic,
            due_ms=due_ms,
            duration_ms=self.clock() - started,
            error_class=failure.error_class.value if failure else None,
            error=failure.message if failure else None,
        )
        return Called(attempt, output, failure)

    async def _call_with_capacity(
        self,
        request: Request,
        number: int,
        label: str,
        due_ms: int | None,
        priority: int,
        model: str | None,
        not_before: int | None,
        tenant: str = "",
    ) -> _Made | NotCalled:
        """The call once the model's rate gate (when limited) and a backend slot allow it."""
        target = model or request.model
        tokens = estimate_tokens(request)
        if not self.gate.is_limited(target):
            async with self.limiter.slot(priority, tenant, tokens, not_before):
                return await self._call_in_slot(request, number, label, due_ms, model, not_before, UNLIMITED)
        async with AsyncExitStack() as slot:  # the backend slot, taken by the gate once the model has room
            permit = await self.gate.acquire(
                target,
                tokens,
                max_wait_s=self._time_left_s(request),
                priority=priority,
                slot=lambda: slot.enter_async_context(self.limiter.slot(priority, tenant, tokens, not_before)),
            )
            if permit is None:
                return NotCalled(
                    DeadLetter(
                        ErrorClass.EXPIRED,
                        f"deadline {request.deadline} passed while waiting for rate capacity; not called",
                    )
                )
            return await self._call_in_slot(request, number, label, due_ms, model, not_before, permit)

    async def _call_in_slot(
        self,
        request: Request,
        number: int,
        label: str,
        due_ms: int | None,
        model: str | None,
        not_before: int | None,
        permit: Permit,
    ) -> _Made | NotCalled:
        """The call itself, holding a backend slot."""
        self._waiting(False)  # a slot is taken shortly ahead of a due time: a release lets it run
        if not_before is not None:
            await self.limiter.hold_until(self.clock, not_before)  # the slot is held (lent) meanwhile
        started = self.clock()
        expired = past_deadline(request.deadline, started)
        if expired is not None:
            return NotCalled(expired)
        if due_ms is not None:
            self._note_lateness(request, number, label, due_ms, started)
        output, failure = await self.call_backend(request, number, model)
        self.after_call(model or request.model, permit, output, failure, (self.clock() - started) / 1000)
        return _Made(started, output, failure)

    def _step(self) -> Step | None:
        """The calling step, when there is one (and `steps` to find it)."""
        return self.steps.current() if self.steps is not None else None

    def _waiting(self, waiting: bool) -> None:
        """Mark the calling step as waiting to call (or no longer)."""
        if (step := self._step()) is not None:
            step.waiting = waiting

    def _called(self) -> None:
        """Mark the calling step as having made an attempt (a held call is not one: a
        backend-wide failure used nothing)."""
        if (step := self._step()) is not None:
            step.called = True

    def _note_lateness(self, request: Request, number: int, label: str, due_ms: int, started: int) -> None:
        metrics.lateness.labels(label).observe(max(0, started - due_ms) / 1000)
        self.lateness.add(label, started - due_ms, started)
        if started - due_ms > LATE_WARNING_MS:
            log_event(
                log,
                logging.WARNING,
                "retry_late",
                request_id=request.request_id,
                tier=label,
                attempt=number,
                late_ms=started - due_ms,
                due=due_ms,
            )

    def _time_left_s(self, request: Request) -> float | None:
        """How long the request may still wait for capacity (None: no deadline)."""
        return None if request.deadline is None else max(0.0, (request.deadline - self.clock()) / 1000)

    def after_call(
        self,
        model: str | None,
        permit: Permit,
        output: InferenceOutput | None,
        failure: Failure | None,
        latency_s: float,
    ) -> None:
        """Feed flow control: the real token usage, a 429's Retry-After, adaptive concurrency."""
        if output is not None:
            permit.settle(used_tokens(output.usage))
        elif failure is not None and failure.error_class is ErrorClass.RATE_LIMITED:
            permit.settle(0)  # refused: it used no tokens
            if failure.retry_after_ms:
                self.gate.pause(model, failure.retry_after_ms / 1000)
        self.limiter.record(latency_s, pushed_back(failure, latency_s, self._timeout_s, self.limiter.is_slow))

    async def call_backend(
        self, request: Request, attempt: int, model: str | None = None
    ) -> tuple[InferenceOutput | None, Failure | None]:
        """One backend call, bounded by DLQ_INFERENCE_TIMEOUT; never raises."""
        try:
            if self.backend.bounds_its_calls:  # a timeout scope per call is a few % of a worker's CPU
                output = await self.backend.complete(request, attempt, model)
            else:
                async with asyncio.timeout(self._timeout_s):
                    output = await self.backend.complete(request, attempt, model)
        except Exception as exc:  # every failure is classified, nothing escapes
            return None, classify_exception(exc)
        return output, None
