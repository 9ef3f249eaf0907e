"""The retry timer fires ahead of due time by the recent hand-over; the attempt waits for the due time."""

import asyncio

from dlqapp.core.headers import H_RUN_NOW
from dlqapp.core.record import Record
from dlqapp.retries.handover import is_run_now
from dlqapp.retries.lead import MIN_LEAD_MS, DueLead
from tests.unit.fakes import FakeMessage, ScriptedBackend, consumed, request, worker


def input_event(request_id: str) -> Record:
    return consumed(request_id.encode(), request(request_id), message=FakeMessage("input", 0, 0))


def test_the_lead_is_the_worst_recent_hand_over_with_a_margin_between_floor_and_cap():
    now = [0.0]
    lead = DueLead(cap_ms=1000, clock=lambda: now[0])
    assert lead.ms == MIN_LEAD_MS  # nothing measured yet, and quick hand-overs keep the floor
    lead.observe(20)
    assert lead.ms == MIN_LEAD_MS
    lead.observe(400)
    assert lead.ms == 600  # a slow one widens it at once
    lead.observe(10)
    now[0] += 40  # the next window still remembers it
    lead.observe(10)
    assert lead.ms == 600
    now[0] += 40  # two windows later it is forgotten
    lead.observe(10)
    assert lead.ms == MIN_LEAD_MS
    lead.observe(5000)
    assert lead.ms == 1000  # never more than the cap


def test_a_cap_of_zero_fires_when_due():
    lead = DueLead(cap_ms=0)
    lead.observe(500)
    assert lead.ms == 0


def test_only_a_run_now_header_asks_for_the_attempt_at_once():
    def read(headers):  # through the door, as the due agent reads them
        return consumed(b"r1", b"key", headers).headers

    assert is_run_now(read([(H_RUN_NOW, b"1")])) and is_run_now(read({H_RUN_NOW: b""}))
    assert (
        not is_run_now(read(None))
        and not is_run_now(read([]))
        and not is_run_now(read(b"garbage"))
        and not is_run_now(read([("other", b"1")]))
    )


def _parked_retry(tmp_path):
    w = worker(tmp_path, ScriptedBackend({"r7": 1}))
    asyncio.run(w.pipeline.on_input(input_event("r7"), w.input))
    key = next(iter(w.parked_table))
    return w, key


def test_a_retry_handed_over_early_is_attempted_at_its_due_time_not_before(tmp_path):
    w, key = _parked_retry(tmp_path)
    due = w.clock.now + 1000

    async def run():
        w.clock.now = due - 30  # handed over 30 ms early
        attempt = asyncio.create_task(w.scheduler.on_due(consumed(b"r7", key, message=FakeMessage("due"))))
        await asyncio.sleep(0.005)
        assert w.backend.calls_for("r7") == 1 and not attempt.done()  # still waiting
        await asyncio.sleep(0.05)
        assert w.backend.calls_for("r7") == 1 and not attempt.done()  # the clock says it is not due yet
        w.clock.now = due
        await asyncio.wait_for(attempt, 5)

    asyncio.run(run())
    assert w.backend.calls_for("r7") == 2 and w.results.keys() == ["r7"] and key not in w.parked_table


def test_run_now_does_not_wait_for_the_due_time(tmp_path):
    w, key = _parked_retry(tmp_path)
    event = consumed(b"r7", key, headers={H_RUN_NOW: b"1"}, message=FakeMessage("due"))
    asyncio.run(asyncio.wait_for(w.scheduler.on_due(event), 5))
    assert w.backend.calls_for("r7") == 2 and w.results.keys() == ["r7"]


def test_a_due_retry_takes_its_backend_slot_ahead_of_its_due_time_and_calls_at_it(tmp_path):
    """Under a flood every slot is busy with fresh input: a retry asking for one only when
    due would wait for the next call to end. It takes one SLOT_AHEAD_MS early and holds it."""
    from dlqapp.retries.scheduler import SLOT_AHEAD_MS

    w, key = _parked_retry(tmp_path)
    due = w.clock.now + 1000

    async def run():
        w.clock.now = due - SLOT_AHEAD_MS - 50  # handed over early: not even the slot yet
        attempt = asyncio.create_task(w.scheduler.on_due(consumed(b"r7", key, message=FakeMessage("due"))))
        await asyncio.sleep(0.01)
        assert w.caller.limiter.in_use == 0
        w.clock.now = due - SLOT_AHEAD_MS // 2  # within the slot lead: the slot is taken, the call waits
        await asyncio.sleep(0.08)
        assert w.caller.limiter.in_use == 1 and w.backend.calls_for("r7") == 1 and not attempt.done()
        w.clock.now = due
        await asyncio.wait_for(attempt, 5)
        assert w.caller.limiter.in_use == 0

    asyncio.run(run())
    assert w.backend.calls_for("r7") == 2 and w.results.keys() == ["r7"]


def test_the_timer_ticks_while_anything_is_parked_and_sleeps_a_quarter_second_when_nothing_is():
    from types import SimpleNamespace

    from dlqapp.wiring.services import IDLE_TIMER_SLEEP_S, RetryTimer

    now = 1_000_000
    scheduler = SimpleNamespace(
        lead=DueLead(cap_ms=1000), clock=lambda: now, handed_over={}, parked=SimpleNamespace(on_park=None)
    )
    timer = RetryTimer(app=None, scheduler=scheduler, interval_ms=20)
    scheduler.next_hand_over_at = now - 995  # due in 5 ms: handed over at this tick, long before it is due
    assert timer.next_sleep_s() == 0.02
    scheduler.next_hand_over_at = now + 60_000  # parked for later: ticks still (the lead may grow meanwhile)
    assert timer.next_sleep_s() == 0.02
    scheduler.next_hand_over_at = None  # nothing parked: a park wakes it
    assert timer.next_sleep_s() == IDLE_TIMER_SLEEP_S == 0.25
    scheduler.handed_over = {b"k": now}  # handed over, not yet attempted: tick
    assert timer.next_sleep_s() == 0.02
    scheduler.handed_over = {}
    timer._settling = True  # partitions moved: tick until a tick has run
    assert timer.next_sleep_s() == 0.02
    timer._settling = False
    scheduler.lead = DueLead(cap_ms=0)
    scheduler.next_hand_over_at = now + 5
    assert timer.next_sleep_s() == 0.005  # no lead: wake when it falls due
    scheduler.next_hand_over_at = now + 60_000
    assert timer.next_sleep_s() == 0.02
    scheduler.next_hand_over_at = None
    assert timer.next_sleep_s() == 0.25


def test_a_park_wakes_a_long_sleep_only_when_it_is_to_be_handed_over_before_the_sleep_ends():
    """A burst of parks for later must not wake the timer once per park (a scan each)."""
    from types import SimpleNamespace

    from dlqapp.wiring.services import RetryTimer

    now = 1_000_000
    scheduler = SimpleNamespace(lead=DueLead(cap_ms=1000), clock=lambda: now, parked=SimpleNamespace(on_park=None))
    timer = RetryTimer(app=None, scheduler=scheduler, interval_ms=20)
    assert scheduler.parked.on_park == timer._on_park
    timer._wakes_at = now + 250  # asleep until then; the lead is 500 ms
    timer._on_park(now + 1000)  # handed over at +500: after the sleep
    assert not timer._parked.is_set()
    timer._on_park(now + 700)  # handed over at +200: before it
    assert timer._parked.is_set()
    timer._parked.clear()
    timer._wakes_at = None  # a tick is running: any park ends the next long sleep at once
    timer._on_park(now + 60_000)
    assert timer._parked.is_set()


def test_a_park_wakes_the_idle_timer_at_once(tmp_path, monkeypatch):
    """An idle timer sleeps long (here a minute); a retry parked meanwhile is handed over
    without waiting for the sleep to end, and a park during a tick ends the next sleep."""
    from types import SimpleNamespace

    from dlqapp.core.envelope import Envelope
    from dlqapp.wiring import services

    monkeypatch.setattr(services, "IDLE_TIMER_SLEEP_S", 60.0)
    w = worker(tmp_path)
    ticks = []

    async def hand_over_due():
        ticks.append(w.scheduler.clock())
        w.scheduler.next_due = None  # nothing left to hand over: the next sleep is long
        return 0

    async def recount():
        return None

    w.scheduler.hand_over_due = hand_over_due
    w.parked.recount_if_reassigned = recount
    app = SimpleNamespace(should_stop=False, rebalancing=False, in_recovery=False)
    timer = services.RetryTimer(app=app, scheduler=w.scheduler, interval_ms=20)

    async def wait_for_ticks(count: int) -> None:
        while len(ticks) < count:
            await asyncio.sleep(0.005)

    async def scenario():
        loop = asyncio.create_task(timer._run(timer))
        try:
            w.scheduler.next_due = None
            await asyncio.sleep(0.1)  # five ticks' time: asleep for its minute
            assert ticks == []
            due = w.clock.now + 1000
            w.parked.store(Envelope("r1", request("r1"), w.clock.now, {}, attempts=1, due_ms=due), w.parked.tiers[0])
            await asyncio.wait_for(wait_for_ticks(1), 5)  # woken by the park
        finally:
            loop.cancel()

    asyncio.run(scenario())
    assert len(ticks) == 1


def test_a_retry_handed_over_while_its_previous_attempt_finishes_waits_for_it_not_for_the_refire(tmp_path):
    """Issue 34's soak: the timer hands a 1 s retry over up to a second early, sometimes before
    the attempt that parked it has left its step; that hand-over was dropped, and the retry
    ran REFIRE_AFTER_MS (2 min) late."""
    w, key = _parked_retry(tmp_path)
    w.clock.now += 1000  # due now

    async def run():
        w.pipeline.in_flight.add("r7")  # the previous attempt is still finishing
        attempt = asyncio.create_task(w.scheduler.on_due(consumed(b"r7", key, message=FakeMessage("due"))))
        await asyncio.sleep(0.02)
        assert not attempt.done() and w.backend.calls_for("r7") == 1  # waits; it neither drops nor runs beside it
        w.pipeline.in_flight.discard("r7")  # the previous attempt's end
        await asyncio.wait_for(attempt, 5)

    asyncio.run(run())
    assert w.backend.calls_for("r7") == 2 and w.results.keys() == ["r7"] and key not in w.parked_table
