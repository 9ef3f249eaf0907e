"""The backend caller marks its step waiting until the call starts (a release may hand such
a step back at once: InFlightWindow.release)."""

import asyncio

from dlqapp.core.backend import InferenceOutput
from dlqapp.core.breaker import BreakerConfig, CircuitBreaker
from dlqapp.core.errors import ErrorClass, InferenceError
from dlqapp.core.requests import Request
from dlqapp.flowcontrol.slots import SlotLimiter
from dlqapp.observability.lateness import LatenessWindow
from dlqapp.processing.caller import BackendCaller
from dlqapp.tables.step import Step, StepContext


class MarkedBackend:
    """Records whether the calling step was marked waiting when the call reached it."""

    bounds_its_calls = False

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


class FailingBackend:
    """A backend that answers every call with a 500 of the request's own."""

    bounds_its_calls = False

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request, attempt, model=None):
        self.calls += 1
        raise InferenceError(ErrorClass.SERVER_ERROR, "500 for this prompt")


def caller_failing_every_call(consecutive: int) -> tuple[BackendCaller, CircuitBreaker, FailingBackend]:
    backend = FailingBackend()
    breaker = CircuitBreaker(BreakerConfig(consecutive=consecutive), lambda: 0)
    caller = BackendCaller(
        backend, breaker, SlotLimiter(4), timeout_ms=1000, clock=lambda: 0, lateness=LatenessWindow()
    )
    return caller, breaker, backend


def test_replayed_dead_letters_failing_again_are_attempts_and_never_open_the_breaker():
    """A dead letter an operator replays starts again at attempt 1, but it has failed before:
    its failure is its own (dlqapp.core.breaker). Counted as fresh, 40 replays of requests
    failing for their own reasons opened the breaker and kept re-opening it on their probes,
    holding every other request for minutes."""

    async def run(replayed: bool) -> tuple[str, list[bool], int]:
        caller, breaker, backend = caller_failing_every_call(consecutive=3)
        made: list[bool] = []
        for n in range(3):
            request = Request(f"r{n}", "m", [{"role": "user", "content": "hi"}], None, {}, {})
            call = caller.call(
                request, number=1, topic="input", label="input", due_ms=None, priority=0, replayed=replayed
            )
            try:
                result = await asyncio.wait_for(call, 0.5)
                made.append(result.failure is not None)
            except TimeoutError:  # held by the breaker it opened
                made.append(False)
        return breaker.state, made, backend.calls

    assert asyncio.run(run(replayed=True)) == ("closed", [True, True, True], 3)
    state, made, _ = asyncio.run(run(replayed=False))  # fresh requests failing alike: an outage
    assert state == "open" and made[-1] is False


class SlowBackend:
    """Answers after `delay_s`; bounds its own calls or leaves that to the caller."""

    def __init__(self, delay_s: float, bounds_its_calls: bool) -> None:
        self.delay_s = delay_s
        self.bounds_its_calls = bounds_its_calls

    async def complete(self, request, attempt, model=None):
        await asyncio.sleep(self.delay_s)
        return InferenceOutput(text="late", model="m")


def test_the_caller_bounds_a_call_unless_the_backend_bounds_its_own():
    """DLQ_INFERENCE_TIMEOUT ends a slow call (a timeout, classified); a backend that ends its
    own calls (the OpenAI one: one timer per call) gets no second timeout scope."""

    async def call(backend: SlowBackend):
        breaker = CircuitBreaker(BreakerConfig(), lambda: 0)
        caller = BackendCaller(
            backend, breaker, SlotLimiter(4), timeout_ms=50, clock=lambda: 0, lateness=LatenessWindow()
        )
        request = Request("r1", "m", [{"role": "user", "content": "hi"}], None, {}, {})
        return await caller.call_backend(request, 1)

    output, failure = asyncio.run(call(SlowBackend(5, bounds_its_calls=False)))
    assert output is None and failure is not None and failure.error_class is ErrorClass.TIMEOUT
    output, failure = asyncio.run(call(SlowBackend(0.2, bounds_its_calls=True)))
    assert failure is None and output is not None and output.text == "late"
