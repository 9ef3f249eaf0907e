from dlqapp.breaker import CLOSED, HALF_OPEN, OPEN, BreakerConfig, CircuitBreaker
from dlqapp.classification import ErrorClass, Failure

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
