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


def test_with_a_lead_the_timer_just_ticks_and_without_one_it_wakes_for_the_next_retry():
    from types import SimpleNamespace

    from dlqapp.wiring.services import RetryTimer

    now = 1_000_000
    scheduler = SimpleNamespace(next_due=now + 5, lead=DueLead(cap_ms=1000), clock=lambda: now)
    scheduler.next_hand_over_at = scheduler.next_due - scheduler.lead.ms
    timer = RetryTimer(app=None, scheduler=scheduler, interval_ms=20)
    assert timer.next_sleep_s() == 0.02  # handed over long before it is due at any tick
    scheduler.lead = DueLead(cap_ms=0)
    scheduler.next_hand_over_at = scheduler.next_due
    assert timer.next_sleep_s() == 0.005  # no lead: wake when it falls due
    scheduler.next_hand_over_at = None
    assert timer.next_sleep_s() == 0.02


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
