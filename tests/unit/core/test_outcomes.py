from dlqapp.core.backoff import Backoff
from dlqapp.core.errors import DEFAULT_RETRYABLE, ErrorClass, Failure
from dlqapp.core.outcomes import (
    DeadLetter,
    RetryAt,
    RetryPolicy,
    Succeeded,
    decide,
    expiry,
    past_deadline,
)
from dlqapp.inference import InferenceOutput

POLICY = RetryPolicy(Backoff((1000, 10_000, 60_000)), DEFAULT_RETRYABLE, max_age_ms=3_600_000)
NOW = 1_700_000_000_000


def test_success_publishes():
    out = InferenceOutput("hi", "m")
    assert decide(POLICY, 1, None, output=out, now_ms=NOW) == Succeeded(out)


def test_retryable_failures_walk_the_tiers():
    failure = Failure(ErrorClass.SERVER_ERROR, "503")
    assert decide(POLICY, 1, failure, output=None, now_ms=NOW) == RetryAt(0, NOW + 1000, failure)
    assert decide(POLICY, 2, failure, output=None, now_ms=NOW) == RetryAt(1, NOW + 10_000, failure)
    assert decide(POLICY, 3, failure, output=None, now_ms=NOW) == RetryAt(2, NOW + 60_000, failure)


def test_after_the_last_tier_the_request_is_dead_lettered_as_final():
    outcome = decide(POLICY, 4, Failure(ErrorClass.TIMEOUT, "slow"), output=None, now_ms=NOW)
    assert isinstance(outcome, DeadLetter) and outcome.final
    assert outcome.error_class is ErrorClass.TIMEOUT and "4 attempts" in outcome.reason


def test_non_retryable_goes_to_the_dlq_at_once():
    for cls in (
        ErrorClass.AUTH_ERROR,
        ErrorClass.INVALID_REQUEST,
        ErrorClass.CONTEXT_LENGTH,
        ErrorClass.CONTENT_FILTER,
    ):
        outcome = decide(POLICY, 1, Failure(cls, "no"), output=None, now_ms=NOW)
        assert isinstance(outcome, DeadLetter) and outcome.error_class is cls and not outcome.final


def test_rate_limit_retry_after_sets_the_due_time_exactly():
    failure = Failure(ErrorClass.RATE_LIMITED, "429", retry_after_ms=3000)
    assert decide(POLICY, 1, failure, output=None, now_ms=NOW) == RetryAt(0, NOW + 3000, failure)


def test_overrides_change_the_route():
    policy = RetryPolicy(POLICY.backoff, {**DEFAULT_RETRYABLE, ErrorClass.UNKNOWN: False}, POLICY.max_age_ms)
    assert isinstance(decide(policy, 1, Failure(ErrorClass.UNKNOWN, "?"), output=None, now_ms=NOW), DeadLetter)


def test_expiry():
    assert expiry(POLICY, NOW - 3_600_000, NOW) is None
    expired = expiry(POLICY, NOW - 3_600_001, NOW)
    assert expired is not None and expired.error_class is ErrorClass.EXPIRED


FALLBACK = RetryPolicy(POLICY.backoff, DEFAULT_RETRYABLE, POLICY.max_age_ms, fallback_model="big-context")


def test_fallback_after_the_last_tier_and_on_context_length():
    from dlqapp.core.outcomes import TryFallback, decide_after_fallback

    assert decide(FALLBACK, 4, Failure(ErrorClass.TIMEOUT, "slow"), output=None, now_ms=NOW) == TryFallback(
        "big-context", Failure(ErrorClass.TIMEOUT, "slow")
    )
    too_long = Failure(ErrorClass.CONTEXT_LENGTH, "too long")
    assert decide(FALLBACK, 1, too_long, output=None, now_ms=NOW) == TryFallback("big-context", too_long)
    assert isinstance(decide(FALLBACK, 1, Failure(ErrorClass.AUTH_ERROR, "no"), output=None, now_ms=NOW), DeadLetter)
    assert isinstance(decide(FALLBACK, 2, Failure(ErrorClass.TIMEOUT, "slow"), output=None, now_ms=NOW), RetryAt)
    out = InferenceOutput("ok", "big-context")
    assert decide_after_fallback("big-context", None, output=out, attempts=5) == Succeeded(out)
    dead = decide_after_fallback("big-context", Failure(ErrorClass.SERVER_ERROR, "503"), output=None, attempts=5)
    assert dead.final and "fallback model big-context" in dead.reason


def test_a_deadline_written_in_seconds_is_expired_with_a_hint_and_one_in_milliseconds_without():
    now = 1_796_000_000_000
    seconds = past_deadline(1_795_956_945, now)
    assert seconds is not None and seconds.error_class is ErrorClass.EXPIRED
    assert "epoch seconds" in seconds.reason
    passed = past_deadline(now - 5_000, now)
    assert passed is not None and "5000 ms ago" in passed.reason and "seconds" not in passed.reason
    assert past_deadline(now + 1, now) is None and past_deadline(None, now) is None
