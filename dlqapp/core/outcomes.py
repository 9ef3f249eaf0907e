"""What happens to a request after an attempt, decided in one pure function.

`decide()` returns an explicit outcome (`Succeeded`, `RetryAt`, `DeadLetter`);
`dlqapp.processing.pipeline` carries it out. The retry policy reads top to bottom here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dlqapp.core.backend import InferenceOutput
from dlqapp.core.backoff import Backoff
from dlqapp.core.errors import ErrorClass, Failure, is_retryable


@dataclass(frozen=True)
class Succeeded:
    """The backend answered: publish the result."""

    output: InferenceOutput


@dataclass(frozen=True)
class RetryAt:
    """Park the request on the retry tier at `tier_index` (0-based) until `due_ms`."""

    tier_index: int
    due_ms: int
    failure: Failure


@dataclass(frozen=True)
class DeadLetter:
    """Give up: send the request to the DLQ."""

    error_class: ErrorClass
    reason: str
    final: bool = False


@dataclass(frozen=True)
class TryFallback:
    """Before the DLQ: one attempt on the fallback model."""

    model: str
    failure: Failure


Outcome = Succeeded | RetryAt | DeadLetter | TryFallback


@dataclass(frozen=True)
class RetryPolicy:
    """Tiers, backoff, the retryable table and the TTL."""

    backoff: Backoff
    retryable: dict[ErrorClass, bool]
    max_age_ms: int
    fallback_model: str = ""

    @property
    def tiers(self) -> int:
        return len(self.backoff.delays_ms)

    @property
    def max_attempts(self) -> int:
        """The first attempt plus one per tier."""
        return self.tiers + 1


def expiry(policy: RetryPolicy, original_timestamp: int, now_ms: int) -> DeadLetter | None:
    """A `DeadLetter(expired)` when the request is older than the TTL, else None."""
    age = now_ms - original_timestamp
    if age > policy.max_age_ms:
        return DeadLetter(ErrorClass.EXPIRED, f"request is {age} ms old, over DLQ_MAX_AGE ({policy.max_age_ms} ms)")
    return None


SECONDS_LIKE = 10**11
"""A deadline below this (March 1973 in epoch milliseconds, the year 5138 in seconds) was
almost surely written in seconds."""


def past_deadline(deadline_ms: int | None, now_ms: int) -> DeadLetter | None:
    """A `DeadLetter(expired)` when the request's own `deadline` has passed, else None."""
    if deadline_ms is not None and now_ms > deadline_ms:
        hint = " (it reads as epoch seconds: deadline is epoch milliseconds)" if deadline_ms < SECONDS_LIKE else ""
        return DeadLetter(
            ErrorClass.EXPIRED, f"deadline {deadline_ms} passed {now_ms - deadline_ms} ms ago; not called{hint}"
        )
    return None


def within_deadline(outcome: Outcome, deadline_ms: int | None) -> Outcome:
    """A retry that would fall due after the request's deadline is dead-lettered as `expired` now."""
    if isinstance(outcome, RetryAt) and deadline_ms is not None and outcome.due_ms > deadline_ms:
        return DeadLetter(
            ErrorClass.EXPIRED,
            f"its retry would be due at {outcome.due_ms}, after its deadline {deadline_ms}; last error: "
            f"{outcome.failure.message}",
        )
    return outcome


def decide(
    policy: RetryPolicy,
    attempt: int,
    failure: Failure | None,
    *,
    output: InferenceOutput | None,
    now_ms: int,
    rng: random.Random | None = None,
) -> Outcome:
    """The outcome of attempt number `attempt` (1-based)."""
    if failure is None:
        assert output is not None
        return Succeeded(output)
    if failure.error_class is ErrorClass.CONTEXT_LENGTH and policy.fallback_model:
        return TryFallback(policy.fallback_model, failure)
    if not is_retryable(failure, policy.retryable):
        return DeadLetter(failure.error_class, failure.message)
    if attempt >= policy.max_attempts:
        if policy.fallback_model:
            return TryFallback(policy.fallback_model, failure)
        return DeadLetter(
            failure.error_class,
            f"gave up after {attempt} attempts; last error: {failure.message}",
            final=True,
        )
    tier = attempt - 1
    due = now_ms + policy.backoff.delay_ms(tier, failure.retry_after_ms, rng)
    return RetryAt(tier, due, failure)


def decide_after_fallback(
    model: str, failure: Failure | None, *, output: InferenceOutput | None, attempts: int
) -> Succeeded | DeadLetter:
    """The fallback attempt is the last one: its success is the result, its failure the DLQ."""
    if failure is None:
        assert output is not None
        return Succeeded(output)
    return DeadLetter(
        failure.error_class,
        f"gave up after {attempts} attempts, the last on fallback model {model}: {failure.message}",
        final=True,
    )
