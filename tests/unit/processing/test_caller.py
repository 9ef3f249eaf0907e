"""The backend caller marks its step waiting until the call starts (a release may hand such
a step back at once: InFlightWindow.release)."""

import asyncio

from dlqapp.core.backend import InferenceOutput
from dlqapp.core.breaker import BreakerConfig, CircuitBreaker
from dlqapp.core.requests import Request
from dlqapp.flowcontrol.slots import SlotLimiter
from dlqapp.observability.lateness import LatenessWindow
from dlqapp.processing.caller import BackendCaller
from dlqapp.tables.step import Step, StepContext


class MarkedBackend:
    """Records whether the calling step was marked waiting when the call reached it."""

    def __init__(self, context: StepContext) -> None:
        self.context = context
        self.waiting_at_call: list[bool] = []

    async def complete(self, request, attempt, model=None):
        self.waiting_at_call.append(self.context.current().waiting)
        return InferenceOutput(text="ok", model="m")


def test_a_step_is_marked_waiting_while_the_breaker_holds_it_then_as_having_made_an_attempt():
    async def run():
        context = StepContext()
        backend = MarkedBackend(context)
        now = [0]
        breaker = CircuitBreaker(BreakerConfig(), lambda: now[0])
        caller = BackendCaller(
            backend,
            breaker,
            SlotLimiter(4),
            timeout_ms=1000,
            clock=lambda: now[0],
            lateness=LatenessWindow(),
            steps=context,
        )
        request = Request("r1", "m", [{"role": "user", "content": "hi"}], None, {}, {})
        step = Step(0)
        token = context.enter(step)
        gate_open = asyncio.Event()
        breaker.allow = lambda request_id=None, rank=0: gate_open.is_set()  # open until we say
        call = asyncio.create_task(
            caller.call(request, number=1, topic="input", label="input", due_ms=None, priority=0)
        )
        for _ in range(5):
            await asyncio.sleep(0)
        assert step.waiting and step.only_waiting and not backend.waiting_at_call and not step.called
        gate_open.set()
        await asyncio.wait_for(call, 5)
        assert backend.waiting_at_call == [False] and not step.waiting and step.called
        context.leave(token)

    asyncio.run(run())


def test_a_held_call_is_not_an_attempt_so_its_step_may_still_be_handed_back_while_held_again():
    async def run():
        context = StepContext()
        backend = MarkedBackend(context)
        breaker = CircuitBreaker(BreakerConfig(), lambda: 0)
        open_again = asyncio.Event()
        verdicts = iter([True, False])  # the first call's failure was backend-wide: held
        breaker.record = lambda failure, request_id=None, rank=0: next(verdicts)
        allowed = iter([True])
        breaker.allow = lambda request_id=None, rank=0: next(allowed, open_again.is_set())
        caller = BackendCaller(
            backend, breaker, SlotLimiter(4), timeout_ms=1000, clock=lambda: 0, lateness=LatenessWindow(), steps=context
        )
        request = Request("r1", "m", [{"role": "user", "content": "hi"}], None, {}, {})
        step = Step(0)
        token = context.enter(step)
        call = asyncio.create_task(
            caller.call(request, number=1, topic="input", label="input", due_ms=None, priority=0)
        )
        while len(backend.waiting_at_call) < 1:
            await asyncio.sleep(0)
        for _ in range(5):
            await asyncio.sleep(0)
        assert step.only_waiting and not step.called  # held again after a call that was not an attempt
        open_again.set()
        await asyncio.wait_for(call, 5)
        assert len(backend.waiting_at_call) == 2 and step.called
        context.leave(token)

    asyncio.run(run())
