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


# -- slots held ahead of a due time ----------------------------------------------------------


def _wall_ms() -> int:
    import time

    return time.time_ns() // 1_000_000


def test_a_slot_held_ahead_of_a_later_due_time_is_lent_to_a_retry_due_sooner_and_taken_back():
    async def run():
        limiter = SlotLimiter(1)
        now = _wall_ms()
        started: dict[str, int] = {}

        async def retry(name, due_at):
            async with limiter.slot(DUE, due_at=due_at):
                await limiter.hold_until(_wall_ms, due_at)
                started[name] = _wall_ms()
                assert limiter.in_use == 1

        late = asyncio.create_task(retry("late", now + 300))
        await asyncio.sleep(0.02)  # "late" holds the only slot ahead of its time
        soon = asyncio.create_task(retry("soon", now + 60))
        await asyncio.gather(late, soon)
        assert started["soon"] - (now + 60) < 100  # not after "late"'s call: it took the idle slot
        assert started["late"] >= now + 300  # never early: it asked again at its own time
        assert limiter.in_use == 0

    asyncio.run(run())


def test_a_retry_due_later_than_every_holder_waits_in_line_instead():
    async def run():
        limiter = SlotLimiter(1)
        now = _wall_ms()
        order = []

        async def retry(name, due_at):
            async with limiter.slot(DUE, due_at=due_at):
                await limiter.hold_until(_wall_ms, due_at)
                order.append(name)

        soon = asyncio.create_task(retry("soon", now + 80))
        await asyncio.sleep(0.01)
        late = asyncio.create_task(retry("late", now + 120))
        await asyncio.gather(soon, late)
        assert order == ["soon", "late"] and limiter.in_use == 0

    asyncio.run(run())


def test_a_holder_cancelled_after_lending_its_slot_leaves_the_count_right():
    async def run():
        limiter = SlotLimiter(1)
        now = _wall_ms()

        async def retry(due_at, hold=None):
            async with limiter.slot(DUE, due_at=due_at):
                await limiter.hold_until(_wall_ms, due_at)
                if hold is not None:
                    await hold.wait()

        hold = asyncio.Event()
        late = asyncio.create_task(retry(now + 5_000))
        await asyncio.sleep(0.01)
        soon = asyncio.create_task(retry(now, hold))  # due now: takes the idle slot
        await asyncio.sleep(0.01)
        assert limiter.in_use == 1
        late.cancel()  # lent away, waiting to ask again
        await asyncio.gather(late, return_exceptions=True)
        assert limiter.in_use == 1
        hold.set()
        await soon
        assert limiter.in_use == 0

    asyncio.run(run())


def test_retries_handed_the_slots_of_a_wave_of_calls_start_before_the_wave_goes_on():
    """A wave of calls ending in one pass of the event loop, each slot going to a due retry:
    every retry starts before any call of the wave does its follow-up work (results,
    parked retries), which would otherwise make the last retry late by the whole wave's."""

    async def run():
        limiter = SlotLimiter(8)
        order = []
        answers = asyncio.Event()

        async def call(n):
            async with limiter.slot(NORMAL):
                await answers.wait()
            order.append(f"follow-up {n}")

        async def retry(n):
            async with limiter.slot(DUE):
                order.append(f"start {n}")

        calls = [asyncio.create_task(call(n)) for n in range(8)]
        await asyncio.sleep(0)
        retries = [asyncio.create_task(retry(n)) for n in range(8)]
        await asyncio.sleep(0)
        assert limiter.in_use == 8 and limiter.high_waiting == 8
        answers.set()  # the whole wave answers in one pass
        await asyncio.gather(*calls, *retries)
        starts = [i for i, event in enumerate(order) if event.startswith("start")]
        follow_ups = [i for i, event in enumerate(order) if event.startswith("follow-up")]
        assert len(starts) == 8 and max(starts) < min(follow_ups), order

    asyncio.run(run())


def test_a_call_whose_slot_goes_to_fresh_work_goes_on_at_once():
    """Only a due retry is worth the extra turns: with fresh requests waiting, a call's
    follow-up runs in the same turn as its release."""

    async def run():
        limiter = SlotLimiter(1)
        order = []

        async def call():
            async with limiter.slot(NORMAL):
                await asyncio.sleep(0)
            order.append("follow-up")

        async def fresh():
            async with limiter.slot(NORMAL):
                order.append("fresh")

        first = asyncio.create_task(call())
        await asyncio.sleep(0)
        second = asyncio.create_task(fresh())
        await asyncio.gather(first, second)
        assert order == ["follow-up", "fresh"]

    asyncio.run(run())
