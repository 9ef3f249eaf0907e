"""Request fields `deadline` and `priority` on the core paths, over in-memory fakes."""

from __future__ import annotations

import asyncio
import json

import pytest

from dlqapp.core.record import Record
from dlqapp.core.requests import InvalidRequest, validate_request
from dlqapp.flowcontrol.gate import RateGate
from dlqapp.flowcontrol.limits import parse_rate_limits
from dlqapp.flowcontrol.slots import SlotLimiter
from dlqapp.inference import InferenceOutput
from dlqapp.retries.keys import parked_key
from tests.unit.fakes import FakeMessage, ScriptedBackend, consumed, request, state_of, worker


def input_event(request_id: str, offset: int = 0, **extra) -> Record:
    return consumed(request_id.encode(), request(request_id, **extra), message=FakeMessage("input", 0, offset))


def dead_letter(w, request_id: str) -> dict[str, str]:
    (headers,) = [h for key, _, h, _ in w.dlq.sent if key == request_id.encode()]
    return headers


def test_deadline_and_priority_are_optional_and_validated():
    ok = validate_request({"request_id": "a", "prompt": "p", "deadline": 1_700_000_000_000, "priority": "low"})
    assert ok.deadline == 1_700_000_000_000 and ok.priority == "low"
    plain = validate_request({"request_id": "a", "prompt": "p"})
    assert plain.deadline is None and plain.priority == "normal"
    for bad in (
        {"deadline": "tomorrow"},
        {"deadline": True},
        {"deadline": -5},
        {"deadline": 1.5},
        {"deadline": 10**20},
        {"priority": "urgent"},
        {"priority": 1},
    ):
        with pytest.raises(InvalidRequest, match=r"deadline|priority"):
            validate_request({"request_id": "a", "prompt": "p", **bad})


def test_a_bad_deadline_or_priority_is_dead_lettered_as_invalid_with_its_original_bytes(tmp_path):
    w = worker(tmp_path)
    payload = json.dumps({"request_id": "bad", "prompt": "p", "priority": "urgent", "deadline": "soon"}).encode()
    asyncio.run(w.pipeline.on_input(consumed(b"bad", payload, message=FakeMessage("input", 0, 0)), w.input))
    ((_, value, headers, _),) = w.dlq.sent
    assert value == payload and headers["error_class"] == "invalid_request"
    assert "priority must be one of" in headers["final_error"] and "deadline must be" in headers["final_error"]
    assert w.backend.calls_for("bad") == 0


def test_a_request_past_its_deadline_is_dead_lettered_as_expired_without_a_call(tmp_path):
    w = worker(tmp_path)
    asyncio.run(w.pipeline.on_input(input_event("late", deadline=w.clock.now - 1), w.input))
    assert w.backend.calls_for("late") == 0 and not w.results.sent
    headers = dead_letter(w, "late")
    assert headers["error_class"] == "expired" and "deadline" in headers["final_error"]
    assert state_of(w, "late")["state"] == "dead_lettered"


def test_a_request_whose_deadline_passes_while_parked_is_dead_lettered_when_due_without_a_call(tmp_path):
    w = worker(tmp_path, ScriptedBackend({"parked": 1}))
    asyncio.run(w.pipeline.on_input(input_event("parked", deadline=w.clock.now + 5000), w.input))
    key = parked_key(w.clock.now + 1000, "parked")
    assert key in w.parked_table and w.backend.calls_for("parked") == 1
    w.clock.now += 6000  # the worker was busy (or down): the retry fires after the deadline
    asyncio.run(w.scheduler.on_due(consumed(b"parked", key, message=FakeMessage("due"))))
    assert w.backend.calls_for("parked") == 1 and key not in w.parked_table
    assert dead_letter(w, "parked")["error_class"] == "expired"


def test_a_retry_that_would_fall_due_after_the_deadline_is_dead_lettered_as_expired_at_once(tmp_path):
    w = worker(tmp_path, ScriptedBackend({"soon": 1}))
    asyncio.run(
        w.pipeline.on_input(input_event("soon", deadline=w.clock.now + 500), w.input)
    )  # the 1 s tier is too late
    assert not w.parked_table and not any(topic.sent for topic in w.tiers)
    headers = dead_letter(w, "soon")
    assert (
        headers["error_class"] == "expired"
        and "after its deadline" in headers["final_error"]
        and "server_error" in headers["final_error"]
    )


def test_a_deadline_that_passes_while_waiting_for_rate_capacity_means_no_call(tmp_path):
    w = worker(tmp_path)
    epoch = w.clock

    def monotonic() -> float:
        return epoch.now / 1000

    async def sleep(seconds: float) -> None:
        epoch.now += int(seconds * 1000)
        await asyncio.sleep(0)

    w.caller.gate = RateGate(
        parse_rate_limits("*=1rpm"), default_model="m", clock=monotonic, sleep=sleep
    )  # first capacity in 60 s
    asyncio.run(w.pipeline.on_input(input_event("waits", deadline=w.clock.now + 10_000), w.input))
    assert w.backend.calls_for("waits") == 0
    assert dead_letter(w, "waits")["error_class"] == "expired"
    assert w.caller.limiter.in_use == 0


class GatedBackend(ScriptedBackend):
    """Records the order of calls; the first one waits for `release`."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[str] = []
        self.release = asyncio.Event()

    async def complete(self, request, attempt, model=None):
        self.order.append(request.request_id)
        if len(self.order) == 1:
            await self.release.wait()
        return InferenceOutput(text="answer", model="m")


def test_under_a_full_window_high_priority_requests_are_called_first_and_low_last(tmp_path):
    async def run():
        backend = GatedBackend()
        w = worker(tmp_path, backend)
        w.caller.limiter = SlotLimiter(1)
        first = asyncio.create_task(w.pipeline.on_input(input_event("first"), w.input))
        await asyncio.sleep(0.01)
        arrivals = (("low", "low"), ("normal", None), ("high", "high"), ("normal2", "normal"), ("high2", "high"))
        waiting = []
        for i, (rid, priority) in enumerate(arrivals):
            event = input_event(rid, offset=i + 1, **({"priority": priority} if priority else {}))
            waiting.append(asyncio.create_task(w.pipeline.on_input(event, w.input)))
        await asyncio.sleep(0.01)
        backend.release.set()
        await asyncio.gather(first, *waiting)
        assert backend.order == ["first", "high", "high2", "normal", "normal2", "low"]
        assert sorted(w.results.keys()) == sorted(backend.order)

    asyncio.run(run())


def test_a_call_waiting_for_its_models_capacity_holds_no_backend_slot(tmp_path):
    async def run():
        w = worker(tmp_path)
        w.caller.limiter = SlotLimiter(1)
        w.caller.gate = RateGate(
            parse_rate_limits("slow=1rpm"), default_model="m"
        )  # the first call to "slow" waits a minute
        slow = asyncio.create_task(w.pipeline.on_input(input_event("to-slow", model="slow"), w.input))
        await asyncio.sleep(0.05)
        await asyncio.wait_for(w.pipeline.on_input(input_event("to-other", offset=1, model="other"), w.input), 5)
        assert w.results.keys() == ["to-other"] and w.backend.calls_for("to-slow") == 0
        assert w.caller.limiter.in_use == 0 and w.caller.gate.snapshot()["slow"]["waiting"] == 1
        slow.cancel()

    asyncio.run(run())
