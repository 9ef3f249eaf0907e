"""Adaptive concurrency (AIMD) over a fake clock: the limit, what counts as push-back, and
a virtual-time run against a rate-limited provider."""

from __future__ import annotations

import heapq
import random

import pytest

from dlqapp.core.errors import ErrorClass, Failure
from dlqapp.flowcontrol.aimd import AimdLimit, pushed_back
from dlqapp.flowcontrol.bucket import TokenBucket
from tests.unit.fake_clock import seconds_clock

# -- AIMD ----------------------------------------------------------------------------------


def test_aimd_starts_at_the_floor_doubles_per_round_trip_until_a_drop_then_cuts_and_grows_by_one_per_round_trip():
    clock = seconds_clock()
    aimd = AimdLimit(floor=2, ceiling=64, clock=clock)
    assert aimd.limit == 2
    for _ in range(2):
        aimd.on_sample(1.0, dropped=False, in_flight=aimd.limit)
    assert aimd.limit == 4  # slow start: +1 per success
    while aimd.limit < 40:
        aimd.on_sample(1.0, dropped=False, in_flight=aimd.limit)
    aimd.on_sample(0.01, dropped=True, in_flight=40)
    assert aimd.limit == 28  # × 0.7
    aimd.on_sample(0.01, dropped=True, in_flight=40)
    assert aimd.limit == 28  # the calls already in flight do not cut it again within one latency
    before = aimd.limit
    for _ in range(before + 1):
        aimd.on_sample(1.0, dropped=False, in_flight=before)
    assert aimd.limit == before + 1  # congestion avoidance: about +1 per round trip (a limit's worth of successes)
    clock.now += 1.1
    aimd.on_sample(0.01, dropped=True, in_flight=40)
    assert aimd.limit == int((before + 1) * 0.7)


def test_aimd_stays_between_floor_and_ceiling_and_does_not_grow_while_idle():
    clock = seconds_clock()
    aimd = AimdLimit(floor=3, ceiling=8, clock=clock)
    for _ in range(100):
        aimd.on_sample(0.1, dropped=False, in_flight=8)
    assert aimd.limit == 8
    for _ in range(50):
        clock.now += 1
        aimd.on_sample(0.1, dropped=True, in_flight=8)
    assert aimd.limit == 3
    for _ in range(100):
        aimd.on_sample(0.1, dropped=False, in_flight=1)  # 1 of 3 in use: no evidence more would do
    assert aimd.limit == 3


def test_aimd_treats_a_much_slower_success_as_a_drop():
    clock = seconds_clock()
    aimd = AimdLimit(floor=1, ceiling=100, clock=clock)
    for _ in range(30):
        aimd.on_sample(1.0, dropped=False, in_flight=aimd.limit)
    limit = aimd.limit
    assert not aimd.is_slow(2.0) and aimd.is_slow(3.5)
    aimd.on_sample(3.5, dropped=False, in_flight=limit)
    assert aimd.limit == int(limit * 0.7) and aimd.decreases == 1


def test_aimd_refuses_a_floor_above_the_ceiling():
    with pytest.raises(ValueError):
        AimdLimit(floor=10, ceiling=5, clock=seconds_clock())


def test_push_back_is_a_refusal_or_a_timeout_that_took_its_time():
    never_slow, always_slow = (lambda s: False), (lambda s: True)
    timeout, refused = Failure(ErrorClass.TIMEOUT, "timed out"), Failure(ErrorClass.RATE_LIMITED, "429")
    assert pushed_back(refused, 0.01, 30.0, never_slow)  # a 429 is push-back however fast
    assert pushed_back(timeout, 15.0, 30.0, never_slow)  # took half of DLQ_INFERENCE_TIMEOUT
    assert pushed_back(timeout, 2.0, 30.0, always_slow)  # slow next to the calls around it (a gateway's own timeout)
    assert not pushed_back(timeout, 0.05, 30.0, never_slow)  # reported at once: no sign of load
    assert not pushed_back(Failure(ErrorClass.SERVER_ERROR, "500"), 20.0, 30.0, always_slow)
    assert not pushed_back(None, 20.0, 30.0, always_slow)


def test_instant_timeouts_leave_the_limit_to_grow():
    def limit_after(counted_as_drops: bool) -> int:
        now = [0.0]
        limit = AimdLimit(1, 64, clock=lambda: now[0])
        for i in range(300):
            now[0] += 0.1
            failure = Failure(ErrorClass.TIMEOUT, "simulated") if i % 10 == 0 else None
            dropped = failure is not None if counted_as_drops else pushed_back(failure, 0.05, 30.0, limit.is_slow)
            limit.on_sample(0.05, dropped, in_flight=limit.limit)  # a saturated worker
        return limit.limit

    assert limit_after(counted_as_drops=False) > 32
    assert limit_after(counted_as_drops=True) < 16  # the old rule: one instant timeout in ten kept it low


# -- adaptive concurrency alone against a rate-limited provider, in virtual time -----------


def simulate(rpm: int, latency_s: float, count: int, seed: int = 3) -> dict[str, float]:
    """`count` requests through AIMD (no rate limits) against a provider enforcing `rpm` like
    dlqapp-mock-llm (a bucket of one second); a 429 comes back at once and is retried 1 s later."""
    rng = random.Random(seed)
    clock = seconds_clock()
    aimd = AimdLimit(floor=1, ceiling=64, clock=clock)
    rate = rpm / 60
    provider = TokenBucket(rate, rate, clock, initial=rate)
    events: list[tuple[float, int, str]] = []
    sequence = in_flight = calls = refused = done = 0
    pending = count
    while done < count:
        while in_flight < aimd.limit and pending:
            pending -= 1
            in_flight += 1
            calls += 1
            sequence += 1
            if provider.wait_s(1) == 0:
                provider.take(1)
                heapq.heappush(events, (clock.now + latency_s * rng.uniform(0.8, 1.2), sequence, "ok"))
            else:
                heapq.heappush(events, (clock.now + 0.005, sequence, "429"))
        clock.now, _, kind = heapq.heappop(events)
        if kind == "ok":
            in_flight -= 1
            done += 1
            aimd.on_sample(latency_s, False, in_flight + 1)
        elif kind == "429":
            in_flight -= 1
            refused += 1
            aimd.on_sample(0.005, True, in_flight + 1)
            sequence += 1
            heapq.heappush(events, (clock.now + 1.0, sequence, "retry"))
        else:
            pending += 1
    return {"calls": calls, "refused_share": refused / calls, "per_minute": count / (clock.now - 1000.0) * 60}


@pytest.mark.parametrize("latency_s", [1.0, 1.5, 2.0])
def test_adaptive_concurrency_alone_keeps_429s_under_5_percent_of_calls(latency_s):
    run = simulate(rpm=600, latency_s=latency_s, count=2000)
    assert run["refused_share"] < 0.05, run
    assert run["per_minute"] > 600 * 0.8, run  # and still uses most of the provider's capacity
