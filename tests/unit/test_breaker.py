from dlqapp.core.breaker import CLOSED, HALF_OPEN, OPEN, BreakerConfig, CircuitBreaker
from dlqapp.core.errors import ErrorClass, Failure

DOWN = Failure(ErrorClass.SERVER_ERROR, "503")
BAD_INPUT = Failure(ErrorClass.INVALID_REQUEST, "400")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def breaker(clock, **overrides):
    return CircuitBreaker(BreakerConfig(**{"window": 10, "min_calls": 4, "failure_ratio": 0.5, "open_ms": 5000, "max_open_ms": 20_000, "probes": 2, **overrides}), clock)


def test_opens_on_backend_wide_failures_only():
    clock = Clock()
    b = breaker(clock)
    for _ in range(10):
        assert b.allow()
        b.record(BAD_INPUT)  # the backend answered: it is up
    assert b.state == CLOSED
    for _ in range(10):
        b.record(DOWN)
    assert b.state == OPEN and not b.allow()


def test_needs_min_calls_before_opening():
    b = breaker(Clock())
    for _ in range(3):
        b.record(DOWN)
    assert b.state == CLOSED
    b.record(DOWN)
    assert b.state == OPEN


def test_half_open_probes_then_closes():
    clock = Clock()
    b = breaker(clock)
    for _ in range(4):
        b.record(DOWN)
    clock.now += 5.0
    assert b.state == HALF_OPEN
    assert b.allow() and b.allow() and not b.allow()  # two probes at most
    b.record(None)
    assert b.state == HALF_OPEN
    b.record(None)
    assert b.state == CLOSED and b.allow()
    assert [t[1:] for t in b.transitions] == [(CLOSED, OPEN), (OPEN, HALF_OPEN), (HALF_OPEN, CLOSED)]


def test_a_failed_probe_reopens_for_twice_as_long_up_to_the_cap():
    clock = Clock()
    b = breaker(clock)
    for _ in range(4):
        b.record(DOWN)
    waits = []
    for _ in range(4):
        opened_at = clock.now
        while b.state == OPEN:
            clock.now += 0.5
        waits.append(clock.now - opened_at)
        assert b.allow()
        b.record(DOWN)
    assert waits == [5.0, 10.0, 20.0, 20.0]


def test_disabled_breaker_never_opens():
    b = breaker(Clock(), enabled=False)
    for _ in range(50):
        b.record(DOWN)
    assert b.state == CLOSED


def test_one_request_failing_again_and_again_counts_once():
    b = breaker(Clock())
    for _ in range(20):
        b.record(DOWN, "the-same-broken-request")
    for n in range(3):
        b.record(None, f"fine-{n}")
    assert b.state == CLOSED
    for n in range(3):
        b.record(DOWN, f"other-{n}")
    assert b.state == OPEN  # 4 distinct requests down out of 7 seen


def _open_then_half_open(clock, b):
    for n in range(4):
        b.record(DOWN, f"first-{n}")
    clock.now += 5.0
    assert b.state == HALF_OPEN


def test_half_open_probes_go_to_fresh_requests_before_ones_that_failed():
    clock = Clock()
    b = breaker(clock)
    _open_then_half_open(clock, b)
    b._waiting[0] += 1  # a fresh request is waiting
    assert not b.allow("retry", rank=1)
    assert b.allow("fresh", rank=0)
    b._waiting[0] -= 1
    assert b.allow("retry", rank=1)


def test_a_failing_request_that_failed_before_is_not_held_and_does_not_reopen():
    clock = Clock()
    b = breaker(clock)
    _open_then_half_open(clock, b)
    assert b.allow("always-fails", rank=1)
    assert b.record(DOWN, "always-fails", rank=1) is False  # an attempt: it moves on
    assert b.state == HALF_OPEN
    assert b.allow("always-fails-too", rank=2)  # the next probe may go at once


def test_a_fresh_probe_failing_reopens_and_is_held():
    clock = Clock()
    b = breaker(clock)
    _open_then_half_open(clock, b)
    assert b.allow("fresh", rank=0)
    assert b.record(DOWN, "fresh", rank=0) is True
    assert b.state == OPEN


def test_only_fresh_requests_are_held_when_the_breaker_trips():
    b = breaker(Clock())
    for n in range(3):
        assert b.record(DOWN, f"r{n}", rank=0) is False  # closed: attempts
    assert b.record(DOWN, "r3", rank=0) is True  # this one tripped it: held
    assert b.record(DOWN, "late-retry", rank=1) is False  # failed before: an attempt


def test_always_failing_requests_alone_drain_through_half_open():
    """The livelock of issue 12: only failing requests left, none may be held forever."""
    clock = Clock()
    b = breaker(clock)
    _open_then_half_open(clock, b)
    moved = 0
    for attempt in range(1, 4):
        for n in range(20):
            assert b.allow(f"bad-{n}", rank=attempt)
            assert b.record(DOWN, f"bad-{n}", rank=attempt) is False
            moved += 1
    assert moved == 60 and b.state == HALF_OPEN


def test_requests_failing_again_do_not_open_the_breaker():
    b = breaker(Clock())
    for n in range(20):
        b.record(DOWN, f"retry-{n}", rank=1)  # retries of requests that failed before
    assert b.state == CLOSED
    for n in range(4):
        b.record(DOWN, f"fresh-{n}", rank=0)
    assert b.state == OPEN


def test_a_probe_cancelled_before_its_outcome_is_given_back():
    """A rebalance cancels held calls; leaked probes would leave the breaker half-open for good."""
    clock = Clock()
    b = breaker(clock)
    _open_then_half_open(clock, b)
    assert b.allow("a", rank=0) and b.allow("b", rank=0) and not b.allow("c", rank=0)  # probes=2
    b.abandon("a")
    b.abandon("b")
    assert b.allow("c", rank=0) and b.allow("d", rank=0)
    b.record(None, "c")
    b.record(None, "d")
    assert b.state == CLOSED
