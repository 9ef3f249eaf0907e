"""Flow control's parts over fake clocks: limits, the token bucket, the estimate, AIMD,
slots by priority, the per-model rate gate, and a virtual-time run against a provider."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import random

import pytest

from dlqapp.core.requests import Request
from dlqapp.core.errors import ErrorClass, Failure
from dlqapp.flowcontrol.aimd import AimdLimit, pushed_back
from dlqapp.flowcontrol.bucket import TokenBucket
from dlqapp.flowcontrol.estimate import DEFAULT_COMPLETION_TOKENS, estimate_tokens, used_tokens
from dlqapp.flowcontrol.gate import RateGate
from dlqapp.flowcontrol.limits import ModelLimit, parse_rate_limits
from dlqapp.flowcontrol.slots import DUE, HIGH, LOW, NORMAL, SlotLimiter


class Clock:
    """Seconds that move only when told to (or when a fake sleep passes them)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


# -- limits ------------------------------------------------------------------------------


def test_rate_limits_parse_per_model_with_a_default():
    limits = parse_rate_limits("gpt-4o-mini=5000rpm/2000000tpm, gpt-4o=500rpm/30000tpm,*=1000rpm")
    assert limits.for_model("gpt-4o-mini") == ModelLimit(5000, 2_000_000)
    assert limits.for_model("gpt-4o") == ModelLimit(500, 30_000)
    assert limits.for_model("other") == ModelLimit(1000, None)
    assert parse_rate_limits("a=10TPM").for_model("b") is None  # no `*`: other models are not limited
    assert not parse_rate_limits("")


@pytest.mark.parametrize("text, problem", [
    ("gpt-4o", "should be MODEL="),
    ("gpt-4o=fast", "not a limit"),
    ("gpt-4o=0rpm", "must be positive"),
    ("gpt-4o=1rpm/2rpm", "given twice"),
    ("a=1rpm,a=2rpm", "named twice"),
])
def test_bad_rate_limits_say_what_is_wrong(text, problem):
    with pytest.raises(ValueError, match=problem):
        parse_rate_limits(text)


# -- token bucket -------------------------------------------------------------------------


def test_bucket_refills_at_its_rate_up_to_its_capacity():
    clock = Clock()
    bucket = TokenBucket(10, 5, clock)
    assert bucket.level == 0 and bucket.wait_s(1) == pytest.approx(0.1)
    clock.now += 10
    assert bucket.level == 5  # never above capacity
    bucket.take(5)
    assert bucket.wait_s(2) == pytest.approx(0.2)


def test_bucket_debt_is_repaid_before_anything_else_goes_and_more_than_capacity_waits_for_a_full_bucket():
    clock = Clock()
    bucket = TokenBucket(100, 50, clock, initial=50)
    assert bucket.wait_s(500) == 0  # larger than the bucket: it goes once the bucket is full
    bucket.take(500)
    assert bucket.level == -450 and bucket.wait_s(1) == pytest.approx(4.51)
    bucket.give_back(400)  # the response said it used 100
    assert bucket.level == -50
    bucket.give_back(1000)
    assert bucket.level == 50  # never above capacity


def test_bucket_keeps_no_more_than_a_smaller_new_capacity():
    clock = Clock()
    bucket = TokenBucket(10, 10, clock, initial=10)
    bucket.set_rate(5, 2.5)
    assert bucket.level == 2.5 and bucket.wait_s(3) == pytest.approx(0.0)  # more than capacity: a full bucket will do


# -- the estimate --------------------------------------------------------------------------


def _request(**kwargs) -> Request:
    return Request(request_id="r", model=None, messages=kwargs.pop("messages", None), prompt=kwargs.pop("prompt", None), params=kwargs.pop("params", {}), metadata={})


def test_estimate_is_a_quarter_of_the_characters_plus_per_message_overhead_plus_the_completion_budget():
    assert estimate_tokens(_request(prompt="x" * 400)) == 100 + 4 + DEFAULT_COMPLETION_TOKENS
    messages = [{"role": "system", "content": "y" * 10}, {"role": "user", "content": [{"type": "text", "text": "z" * 7}, {"type": "image_url", "image_url": {"url": "u" * 999}}]}]
    assert estimate_tokens(_request(messages=messages, params={"max_tokens": 50})) == 5 + 8 + 50  # ceil(17 / 4), images count nothing
    assert estimate_tokens(_request(prompt="abcd", params={"max_completion_tokens": 10, "max_tokens": 99, "n": 3})) == 1 + 4 + 30
    assert estimate_tokens(_request(prompt="abcd", params={"max_tokens": "many"})) == 1 + 4 + DEFAULT_COMPLETION_TOKENS


def test_used_tokens_reads_the_usage_of_a_response():
    assert used_tokens({"total_tokens": 42}) == 42
    assert used_tokens({"prompt_tokens": 10, "completion_tokens": 5}) == 15
    assert used_tokens({}) is None and used_tokens(None) is None and used_tokens({"total_tokens": -1}) is None


# -- AIMD ----------------------------------------------------------------------------------


def test_aimd_starts_at_the_floor_doubles_per_round_trip_until_a_drop_then_cuts_and_grows_by_one_per_round_trip():
    clock = Clock()
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
    clock = Clock()
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
    clock = Clock()
    aimd = AimdLimit(floor=1, ceiling=100, clock=clock)
    for _ in range(30):
        aimd.on_sample(1.0, dropped=False, in_flight=aimd.limit)
    limit = aimd.limit
    assert not aimd.is_slow(2.0) and aimd.is_slow(3.5)
    aimd.on_sample(3.5, dropped=False, in_flight=limit)
    assert aimd.limit == int(limit * 0.7) and aimd.decreases == 1


def test_aimd_refuses_a_floor_above_the_ceiling():
    with pytest.raises(ValueError):
        AimdLimit(floor=10, ceiling=5, clock=Clock())


# -- slots by priority -----------------------------------------------------------------------


def test_a_full_window_serves_due_retries_then_high_normal_low():
    async def run():
        limiter = SlotLimiter(1)
        order = []
        hold = asyncio.Event()

        async def user(name, priority, wait=None):
            async with limiter.slot(priority):
                order.append(name)
                if wait:
                    await wait.wait()

        first = asyncio.create_task(user("first", NORMAL, hold))
        await asyncio.sleep(0)
        waiting = [asyncio.create_task(user(name, priority)) for name, priority in (("low", LOW), ("normal", NORMAL), ("high", HIGH), ("due", DUE), ("high2", HIGH))]
        await asyncio.sleep(0)
        assert limiter.high_waiting == 1 and limiter.waiting(HIGH) == 2
        hold.set()
        await asyncio.gather(first, *waiting)
        assert order == ["first", "due", "high", "high2", "normal", "low"]

    asyncio.run(run())


def test_low_priority_waits_at_most_max_passes_grants_under_a_flood_of_high():
    async def run():
        limiter = SlotLimiter(1, max_passes=5)
        order = []
        hold = asyncio.Event()

        async def user(name, priority, wait=None):
            async with limiter.slot(priority):
                order.append(name)
                if wait:
                    await wait.wait()

        blocker = asyncio.create_task(user("first", HIGH, hold))
        await asyncio.sleep(0)
        tasks = [asyncio.create_task(user("low", LOW))] + [asyncio.create_task(user(f"h{i}", HIGH)) for i in range(20)]
        await asyncio.sleep(0)
        hold.set()
        await asyncio.gather(blocker, *tasks)
        assert order.index("low") == 6  # "first", then 5 high ones passed it, then its turn

    asyncio.run(run())


def test_a_shrinking_limit_hands_out_no_slot_until_fewer_are_in_flight():
    async def run():
        clock = Clock()
        aimd = AimdLimit(floor=1, ceiling=4, clock=clock)
        limiter = SlotLimiter(4, aimd)
        for _ in range(10):
            aimd.on_sample(0.1, dropped=False, in_flight=4)
        assert limiter.limit == 4
        release = asyncio.Event()
        started = []

        async def user(i):
            async with limiter.slot(NORMAL):
                started.append(i)
                await release.wait()

        tasks = [asyncio.create_task(user(i)) for i in range(4)]
        await asyncio.sleep(0)
        limiter.record(0.01, dropped=True)  # 4 × 0.7 → 2
        assert limiter.limit == 2 and limiter.in_use == 4
        fifth = asyncio.create_task(user(4))
        await asyncio.sleep(0)
        assert 4 not in started
        release.set()
        await asyncio.gather(*tasks, fifth)
        assert started[-1] == 4 and limiter.in_use == 0

    asyncio.run(run())


# -- the rate gate -------------------------------------------------------------------------------


def test_calls_are_paced_at_the_limit_and_waiting_for_one_model_does_not_block_another():
    async def run():
        clock = Clock()
        gate = RateGate(parse_rate_limits("slow=60rpm"), clock=clock, sleep=clock.sleep)
        sent: list[tuple[str, float]] = []

        async def call(model):
            await gate.acquire(model, 10)
            sent.append((model, clock.now))

        start = clock.now
        await asyncio.gather(*(call("slow") for _ in range(4)), *(call("free") for _ in range(3)))
        slow = [at - start for model, at in sent if model == "slow"]
        assert [model for model, _ in sent[:3]] == ["free"] * 3  # not limited: they went while "slow" waited
        assert slow == pytest.approx([1.0, 2.0, 3.0, 4.0])  # one a second (the bucket starts empty)

    asyncio.run(run())


def test_tokens_are_charged_by_estimate_and_corrected_by_usage():
    async def run():
        clock = Clock()
        gate = RateGate(parse_rate_limits("m=6000tpm"), clock=clock, sleep=clock.sleep)  # 100 tokens/s, bucket of 50
        permit = await gate.acquire("m", 300)  # waits for a full bucket, then leaves it 250 in debt
        assert clock.now == pytest.approx(1000.5)
        permit.settle(50)  # it used 50: 250 come back
        t = clock.now
        await gate.acquire("m", 20)
        assert clock.now - t == pytest.approx(0.2)  # the debt was forgiven: only these 20 tokens to wait for

    asyncio.run(run())


def test_the_share_of_the_owned_partitions_sets_the_rate_and_a_deadline_bounds_the_wait():
    async def run():
        clock = Clock()
        share = [1.0]
        gate = RateGate(parse_rate_limits("*=120rpm"), default_model="d", share=lambda: share[0], clock=clock, sleep=clock.sleep)
        await gate.acquire(None, 1)
        assert clock.now == pytest.approx(1000.5)  # 2 per second
        share[0] = 1 / 3  # a rebalance left this worker a third of the partitions
        t = clock.now
        await gate.acquire(None, 1)
        assert clock.now - t == pytest.approx(1.5)
        assert gate.snapshot()["d"]["rpm"] == pytest.approx(40)
        t = clock.now
        assert await gate.acquire(None, 1, max_wait_s=0.2) is None  # gives up at its deadline
        assert clock.now - t == pytest.approx(0.2)

    asyncio.run(run())


def test_a_retry_after_pauses_a_limited_model_but_never_an_unlimited_one():
    async def run():
        clock = Clock()
        gate = RateGate(parse_rate_limits("m=6000rpm"), clock=clock, sleep=clock.sleep)
        gate.pause("m", 3.0)
        gate.pause("other", 86_400)
        t = clock.now
        await gate.acquire("other", 1)
        assert clock.now == t
        await gate.acquire("m", 1)
        assert clock.now - t == pytest.approx(3.0, abs=0.01)

    asyncio.run(run())


# -- adaptive concurrency alone against a rate-limited provider, in virtual time -----------


def simulate(rpm: int, latency_s: float, count: int, seed: int = 3) -> dict[str, float]:
    """`count` requests through AIMD (no rate limits) against a provider enforcing `rpm` like
    dlqapp-mock-llm (a bucket of one second); a 429 comes back at once and is retried 1 s later."""
    rng = random.Random(seed)
    clock = Clock()
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


def test_capacity_is_taken_when_the_backend_slot_is_granted_so_a_wait_for_a_slot_cannot_make_a_burst():
    async def run():
        clock = Clock()
        gate = RateGate(parse_rate_limits("m=120rpm"), clock=clock, sleep=clock.sleep)  # 2 a second, a bucket of 1
        slots = SlotLimiter(1)
        hold = asyncio.Event()
        sent = []

        async def call(name, wait=None):
            async with contextlib.AsyncExitStack() as stack:
                await gate.acquire("m", 1, slot=lambda: stack.enter_async_context(slots.slot(NORMAL)))
                sent.append((name, clock.now))
                if wait:
                    await wait.wait()

        first = asyncio.create_task(call("first", hold))
        while not sent:
            await asyncio.sleep(0)
        second = asyncio.create_task(call("second"))
        for _ in range(20):
            await asyncio.sleep(0)
        clock.now += 30  # the slot stays busy for half a minute
        hold.set()
        third = asyncio.create_task(call("third"))
        await asyncio.gather(first, second, third)
        (_, t2), (_, t3) = sent[1], sent[2]
        assert t3 - t2 == pytest.approx(0.5)  # paced after the long wait for the slot, not sent together

    asyncio.run(run())


def test_callers_of_one_model_take_their_turns_by_priority():
    async def run():
        clock = Clock()
        gate = RateGate(parse_rate_limits("m=60rpm"), clock=clock, sleep=clock.sleep)
        order = []

        async def call(name, priority):
            await gate.acquire("m", 1, priority=priority)
            order.append(name)

        await asyncio.gather(call("first", NORMAL), call("low", LOW), call("normal", NORMAL), call("high", HIGH), call("due", DUE))
        assert order == ["first", "due", "high", "normal", "low"]

    asyncio.run(run())


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
