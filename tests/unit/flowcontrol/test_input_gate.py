"""The input gate: fresh input waits while due hints are on their way to the due agent."""

from __future__ import annotations

import asyncio

from dlqapp.flowcontrol.input_gate import InputGate
from tests.unit.fake_clock import FakeClock


def gate(breaker_closed: bool = True, max_hold_ms: int = 2_000) -> tuple[InputGate, FakeClock, dict[str, bool]]:
    clock = FakeClock(now=1_000_000)
    breaker = {"closed": breaker_closed}
    return InputGate(lambda: breaker["closed"], clock, max_hold_ms=max_hold_ms), clock, breaker


def test_fired_hints_close_the_gate_until_the_due_agent_has_every_one():
    g, _, _ = gate()
    g.handed_over([b"k1", b"k2"])
    assert not g.is_open and g.in_hop == 2 and g.holds == 1
    g.received(b"k1")
    assert not g.is_open
    g.received(b"k2")
    assert g.is_open and g.in_hop == 0


def test_a_key_the_gate_never_saw_changes_nothing():
    g, _, _ = gate()
    g.handed_over([b"k1"])
    g.received(b"other")
    assert not g.is_open


def test_the_gate_stays_open_while_the_breaker_is_not_closed():
    g, _, breaker = gate(breaker_closed=False)
    g.handed_over([b"k1"])
    assert g.is_open  # fresh requests are the breaker's probes
    breaker["closed"] = True
    g.refresh()
    assert not g.is_open


def test_a_lost_hint_holds_input_back_no_longer_than_max_hold():
    g, clock, _ = gate(max_hold_ms=2_000)
    g.handed_over([b"lost"])
    clock.now += 1_999
    g.refresh()
    assert not g.is_open
    clock.now += 2
    g.refresh()
    assert g.is_open and g.in_hop == 0


def test_a_rebalance_opens_the_gate():
    g, _, _ = gate()
    g.handed_over([b"k1"])
    g.forget()
    assert g.is_open


def test_run_pauses_and_resumes_the_consumer_and_wait_open_waits():
    async def scenario() -> list[bool]:
        g, _, _ = gate()
        applied: list[bool] = []

        async def set_paused(paused: bool) -> None:
            applied.append(paused)

        runner = asyncio.create_task(g.run(set_paused))
        g.handed_over([b"k1"])
        waiter = asyncio.create_task(g.wait_open())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert not waiter.done()
        g.received(b"k1")
        await asyncio.wait_for(waiter, 1)
        await asyncio.sleep(0)
        runner.cancel()
        return applied

    applied = asyncio.run(scenario())
    assert applied[0] is True and applied[-1] is False


def test_a_resume_that_fails_is_tried_again_until_it_is_applied():
    async def scenario() -> list[bool]:
        g, _, _ = gate()
        applied: list[bool] = []
        failures = {"left": 2}

        async def set_paused(paused: bool) -> None:
            if not paused and failures["left"]:
                failures["left"] -= 1
                raise RuntimeError("consumer rebalancing")
            applied.append(paused)

        runner = asyncio.create_task(g.run(set_paused))
        g.handed_over([b"k1"])
        await asyncio.sleep(0.01)
        g.received(b"k1")
        for _ in range(100):
            if applied and applied[-1] is False:
                break
            await asyncio.sleep(0.05)
        runner.cancel()
        return applied

    applied = asyncio.run(scenario())
    assert applied == [True, False]


def test_fetching_is_paused_only_when_input_is_busy_as_the_gate_closes():
    async def scenario() -> list[bool]:
        g, _, _ = gate()
        busy = {"now": False}
        g.pause_fetching_when(lambda: busy["now"])
        applied: list[bool] = []

        async def set_paused(paused: bool) -> None:
            applied.append(paused)

        runner = asyncio.create_task(g.run(set_paused))
        g.handed_over([b"idle"])  # closed, input idle: fetching goes on (the feed still holds input back)
        for _ in range(3):
            await asyncio.sleep(0)
        assert not g.is_open
        g.received(b"idle")
        busy["now"] = True
        g.handed_over([b"flood"])  # closed while input is backlogged: fetching pauses
        for _ in range(3):
            await asyncio.sleep(0)
        runner.cancel()
        return applied

    applied = asyncio.run(scenario())
    assert True not in applied[:1] and applied[-1] is True
