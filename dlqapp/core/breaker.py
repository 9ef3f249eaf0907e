"""A circuit breaker for backend-wide failures: an outage is not N separate failures.

Closed: calls flow, and their outcomes are judged over a *time* window, so the verdict
does not depend on throughput. It opens when either
- over the last `window_ms` at least `min_calls` outcomes were seen and `failure_ratio`
  of them were backend-wide failures (a partial outage; 50 calls, so that the few calls
  of a young or quiet window do not reach half failures by chance: 20 calls at 26 %
  failures do so 2 % of the time, 50 calls 0.03 %), or
- the last `consecutive` outcomes were all backend-wide failures (a hard outage: at 10
  requests/s that takes 1.5 s of traffic, at 1,000 requests/s 15 ms).
A steady partial failure rate below the ratio practically never opens it: at 26 %
failures, the chance that 15 fresh calls fail in a row is 2e-9 (one open in about 80
hours at 1,000 requests/s), and a 10 s window at 10 requests/s holds 100 calls (the
ratio reaching 0.5 by chance is a 5-sigma event). Hystrix's window (10 s, 50 %) and
Envoy's consecutive-5xx rule are the anchors.

Open: no calls for `open_ms` (doubling on each re-open, up to `max_open_ms`). Half-open:
`probes` calls may go; once `failure_ratio` of them failed backend-wide it re-opens,
once that can no longer happen it closes (a random failure among healthy calls does not
keep an open breaker open).

Evidence of an outage (BACKEND_WIDE): connection errors, timeouts, 5xx, rate limits,
quota and auth errors: each fails every request alike when the backend, the network or
the account is down (a revoked key answers 401 to everyone). One request's failure among
successes never opens the breaker (it is one outcome in the window); bad input, context
length and content filters say the backend is up.

Every caller has a *rank*: 0 for a request that has never failed, else how many times
it has failed (counted attempts plus holds; a dead letter an operator replayed has failed
before, though its attempts start again). Two rules keep the breaker from holding a
request forever when its failure is its own (a prompt that crashes the model) rather than
the backend's:

- Half-open probes go to the lowest rank waiting: fresh requests probe first.
- Only a fresh request's failure is evidence of an outage: it counts toward opening the
  breaker, it re-opens a half-open one, and it is held (not counted as an attempt). A
  request that has failed before is never held after a failure and never re-opens the
  breaker: its failure is an attempt and moves it along its retry chain (next tier, then
  the DLQ). A success of any request is evidence that the backend is up.

So during an outage with traffic, fresh requests keep the breaker honest and nothing
burns attempts; when only failing requests are left, they probe, and each probe moves
one of them on.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from dlqapp.core.errors import ErrorClass, Failure

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
BACKEND_WIDE = frozenset(
    {
        ErrorClass.CONNECTION_ERROR,
        ErrorClass.TIMEOUT,
        ErrorClass.SERVER_ERROR,
        ErrorClass.AUTH_ERROR,
        ErrorClass.QUOTA_EXCEEDED,
        ErrorClass.RATE_LIMITED,
    }
)
BUCKETS = 10
"""The time window is kept as this many buckets: it slides in steps of a tenth."""

Move = Callable[[str, str, int | None], None]
"""Told of each state change: (previous, new, open_ms when it opens)."""


def is_backend_wide(failure: Failure | None) -> bool:
    return failure is not None and failure.error_class in BACKEND_WIDE


@dataclass(frozen=True)
class BreakerConfig:
    window_ms: int = 10_000
    min_calls: int = 50
    failure_ratio: float = 0.5
    consecutive: int = 15
    open_ms: int = 5_000
    max_open_ms: int = 60_000
    probes: int = 3
    enabled: bool = True


class OutcomeWindow:
    """Calls and backend-wide failures over the last `window_ms`, in BUCKETS steps,
    and the current run of consecutive failures."""

    def __init__(self, window_ms: int, clock: Callable[[], float]) -> None:
        self._bucket_s = max(window_ms, BUCKETS) / 1000 / BUCKETS
        self._clock = clock
        self._buckets: deque[list[int]] = deque()  # [bucket number, calls, failures]
        self.calls = 0
        self.failures = 0
        self.run = 0

    def add(self, failed: bool) -> None:
        now = self._expire()
        if not self._buckets or self._buckets[-1][0] != now:
            self._buckets.append([now, 0, 0])
        bucket = self._buckets[-1]
        bucket[1] += 1
        self.calls += 1
        if failed:
            bucket[2] += 1
            self.failures += 1
            self.run += 1
        else:
            self.run = 0

    def _expire(self) -> int:
        now = int(self._clock() / self._bucket_s)
        while self._buckets and self._buckets[0][0] <= now - BUCKETS:
            _, calls, failures = self._buckets.popleft()
            self.calls -= calls
            self.failures -= failures
        return now

    def counts(self) -> tuple[int, int]:
        """(calls, backend-wide failures) in the window now."""
        self._expire()
        return self.calls, self.failures

    def clear(self) -> None:
        self._buckets.clear()
        self.calls = self.failures = self.run = 0


class CircuitBreaker:
    """Closed → open → half-open → closed, driven by call outcomes and the clock."""

    def __init__(
        self, config: BreakerConfig, clock: Callable[[], float] = time.monotonic, on_move: Move | None = None
    ) -> None:
        self.config = config
        self.clock = clock
        self._on_move = on_move
        self._state = CLOSED
        self._window = OutcomeWindow(config.window_ms, clock)
        self._open_ms = config.open_ms
        self._reopen_at = 0.0
        self._probing: Counter[object] = Counter()
        self._probes_ok = 0
        self._probes_failed = 0
        self._waiting: Counter[int] = Counter()
        self.transitions: list[tuple[float, str, str]] = []
        self.tripped_at: float | None = None
        """Wall-clock seconds when it last left `closed` (None while closed)."""
        self.moves: Counter[str] = Counter()

    @property
    def state(self) -> str:
        if self._state == OPEN and self.clock() >= self._reopen_at:
            self._move(HALF_OPEN)
            self._probing.clear()
            self._probes_ok = self._probes_failed = 0
        return self._state

    @property
    def tripped(self) -> bool:
        """Open or half-open: the backend is considered down."""
        return self.state != CLOSED

    def allow(self, request_id: object = None, rank: int = 0) -> bool:
        """May this call go now? In half-open each True is one probe, lowest rank first."""
        state = self.state
        if state == CLOSED:
            return True
        if state != HALF_OPEN or sum(self._probing.values()) >= self.config.probes:
            return False
        if any(count > 0 for waiting_rank, count in self._waiting.items() if waiting_rank < rank):
            return False  # a request that has failed less is waiting: it probes first
        self._probing[request_id] += 1
        return True

    async def wait_allowed(self, request_id: object = None, rank: int = 0, poll_s: float = 0.05) -> None:
        """Wait until a call may go."""
        if self.allow(request_id, rank):
            return
        self._waiting[rank] += 1
        try:
            while not self.allow(request_id, rank):
                await asyncio.sleep(poll_s)
        finally:
            self._waiting[rank] -= 1

    def abandon(self, request_id: object = None) -> None:
        """An allowed call that will never be recorded (cancelled on shutdown or a rebalance):
        give its probe back, or a half-open breaker could run out of probes for good."""
        if self._probing[request_id] > 0:
            self._probing[request_id] -= 1
            if not self._probing[request_id]:
                del self._probing[request_id]

    def record(self, failure: Failure | None, request_id: object = None, rank: int = 0) -> bool:
        """The outcome of an allowed call. True: hold the request (the failure is not an attempt)."""
        backend_down = is_backend_wide(failure)
        was_probe = self._probing[request_id] > 0
        if was_probe:
            self._probing[request_id] -= 1
            if not self._probing[request_id]:
                del self._probing[request_id]
        state = self.state
        if state == HALF_OPEN and was_probe:
            if backend_down and rank > 0:
                return False  # its own failure, not the backend's: an attempt, no re-open
            return self._judge_probe(backend_down)
        if state == CLOSED and not (backend_down and rank > 0):  # a repeat failure is no evidence either way
            self._window.add(backend_down)
            if self._should_open():
                self._open(self.config.open_ms)
        return backend_down and rank == 0 and self.state != CLOSED

    def _judge_probe(self, backend_down: bool) -> bool:
        """Half-open: re-open once `failure_ratio` of the probes failed, close once that can
        no longer happen. True when the probe's request is held."""
        needed = max(1, math.ceil(self.config.failure_ratio * self.config.probes))
        if backend_down:
            self._probes_failed += 1
            if self._probes_failed >= needed:
                self._open(min(self._open_ms * 2, self.config.max_open_ms))
            return True
        self._probes_ok += 1
        if self._probes_ok > self.config.probes - needed:
            self._close()
        return False

    def _should_open(self) -> bool:
        if not self.config.enabled:
            return False
        if self._window.run >= self.config.consecutive:
            return True
        calls, failures = self._window.counts()
        return calls >= self.config.min_calls and failures / calls >= self.config.failure_ratio

    def _open(self, open_ms: int) -> None:
        self._open_ms = open_ms
        self._reopen_at = self.clock() + open_ms / 1000
        self._move(OPEN)

    def _close(self) -> None:
        self._window.clear()
        self._open_ms = self.config.open_ms
        self._move(CLOSED)

    def _move(self, new: str) -> None:
        old, self._state = self._state, new
        if old == CLOSED and new != CLOSED:
            self.tripped_at = time.time()
        elif new == CLOSED:
            self.tripped_at = None
        self.transitions.append((time.time(), old, new))
        self.moves[f"{old}->{new}"] += 1
        del self.transitions[:-50]
        if self._on_move is not None:
            self._on_move(old, new, self._open_ms if new == OPEN else None)

    def snapshot(self) -> dict[str, object]:
        """State for /dlq/stats/ and metrics."""
        state = self.state
        calls, failures = self._window.counts()
        return {
            "state": state,
            "recent_calls": calls,
            "recent_backend_failures": failures,
            "waiting": sum(self._waiting.values()),
            "reopens_in_ms": max(0, int((self._reopen_at - self.clock()) * 1000)) if state == OPEN else None,
            "tripped_since": int(self.tripped_at * 1000) if self.tripped_at is not None else None,
            "moves": dict(self.moves),
            "transitions": [{"at": int(at * 1000), "from": a, "to": b} for at, a, b in self.transitions[-10:]],
        }
