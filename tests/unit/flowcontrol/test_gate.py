"""The per-model rate gate over a fake clock: pacing, tokens, the partition share,
retry-after pauses, backend slots and priorities."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from dlqapp.flowcontrol.gate import RateGate
from dlqapp.flowcontrol.limits import parse_rate_limits
from dlqapp.flowcontrol.slots import DUE, HIGH, LOW, NORMAL, SlotLimiter
from tests.unit.fake_clock import seconds_clock

# -- the rate gate -------------------------------------------------------------------------------


def test_calls_are_paced_at_the_limit_and_waiting_for_one_model_does_not_block_another():
    async def run():
        clock = seconds_clock()
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
        clock = seconds_clock()
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
        clock = seconds_clock()
        share = [1.0]
        gate = RateGate(
            parse_rate_limits("*=120rpm"), default_model="d", share=lambda: share[0], clock=clock, sleep=clock.sleep
        )
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
        clock = seconds_clock()
        gate = RateGate(parse_rate_limits("m=6000rpm"), clock=clock, sleep=clock.sleep)
        gate.pause("m", 3.0)
        gate.pause("other", 86_400)
        t = clock.now
        await gate.acquire("other", 1)
        assert clock.now == t
        await gate.acquire("m", 1)
        assert clock.now - t == pytest.approx(3.0, abs=0.01)

    asyncio.run(run())


def test_capacity_is_taken_when_the_backend_slot_is_granted_so_a_wait_for_a_slot_cannot_make_a_burst():
    async def run():
        clock = seconds_clock()
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
        clock = seconds_clock()
        gate = RateGate(parse_rate_limits("m=60rpm"), clock=clock, sleep=clock.sleep)
        order = []

        async def call(name, priority):
            await gate.acquire("m", 1, priority=priority)
            order.append(name)

        await asyncio.gather(
            call("first", NORMAL), call("low", LOW), call("normal", NORMAL), call("high", HIGH), call("due", DUE)
        )
        assert order == ["first", "due", "high", "normal", "low"]

    asyncio.run(run())
