"""How early the retry timer hands a parked retry to the due agent."""

from __future__ import annotations

import time
from collections.abc import Callable

MIN_LEAD_MS = 500
"""Never less: an idle hand-over takes a few milliseconds, but a stall of the machine (a
disk flush, a busy neighbour) makes single ones take 100-250 ms, and while a burst of
failures is parked a timer tick itself starts up to 150 ms late on a busy 2-core machine
(measured by stage; both add up before the first slow hand-over is observed)."""
MARGIN = 1.5
"""The lead is this many times the worst recent hand-over."""
WINDOW_S = 30.0
"""Hand-overs are remembered for one to two windows of this length."""


class DueLead:
    """The time to fire ahead of a retry's due time: the worst hand-over (timer to due agent:
    the due topic, the consumer, the due agent's queue and window) of the last 30-60 s,
    with a margin, between `MIN_LEAD_MS` and `cap_ms`.

    The due agent waits for the due time itself, so the hand-over does not add to a retry's
    lateness unless it takes longer than the lead. `cap_ms` 0 turns firing early off.
    """

    def __init__(self, cap_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.cap_ms = cap_ms
        self._clock = clock
        self._window_start = clock()
        self._worst_ms = 0.0
        self._previous_worst_ms = 0.0

    def observe(self, hand_over_ms: float) -> None:
        """A due message took `hand_over_ms` from the timer to the due agent."""
        self._roll()
        self._worst_ms = max(self._worst_ms, hand_over_ms)

    @property
    def ms(self) -> int:
        if self.cap_ms <= 0:
            return 0
        self._roll()
        worst = max(self._worst_ms, self._previous_worst_ms)
        return int(min(self.cap_ms, max(MIN_LEAD_MS, worst * MARGIN)))

    def _roll(self) -> None:
        now = self._clock()
        if now - self._window_start < WINDOW_S:
            return
        self._previous_worst_ms = self._worst_ms if now - self._window_start < 2 * WINDOW_S else 0.0
        self._worst_ms = 0.0
        self._window_start = now
