"""Backend slots by priority, and under a limit that AIMD shrinks; the limit holds under cancellation."""

from __future__ import annotations

import asyncio

from dlqapp.flowcontrol.aimd import AimdLimit
from dlqapp.flowcontrol.slots import DUE, HIGH, LOW, NORMAL, SlotLimiter
from tests.unit.fake_clock import seconds_clock

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
        waiting = [
            asyncio.create_task(user(name, priority))
            for name, priority in (("low", LOW), ("normal", NORMAL), ("high", HIGH), ("due", DUE), ("high2", HIGH))
        ]
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
        clock = seconds_clock()
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


def test_limiter_serves_high_priority_waiters_first():
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
        lows = [asyncio.create_task(user(f"low{i}", NORMAL)) for i in range(3)]
        await asyncio.sleep(0)
        high = asyncio.create_task(user("high", DUE))
        await asyncio.sleep(0)
        assert limiter.high_waiting == 1
        hold.set()
        await asyncio.gather(first, high, *lows)
        assert order == ["first", "high", "low0", "low1", "low2"]

    asyncio.run(run())


def test_limiter_never_exceeds_its_limit_and_survives_cancellation():
    async def run():
        limiter = SlotLimiter(3)
        active = peak = 0

        async def user(i):
            nonlocal active, peak
            async with limiter.slot(i % 2):
                active += 1
                peak = max(peak, active)
                await asyncio.sleep(0.001)
                active -= 1

        tasks = [asyncio.create_task(user(i)) for i in range(50)]
        await asyncio.sleep(0)
        tasks[10].cancel()
        tasks[20].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert peak == 3
        async with limiter.slot(NORMAL):  # every slot came back
            pass
        assert limiter.in_use == 0

    asyncio.run(run())
