"""How early the retry timer hands a parked retry to the due agent."""

from __future__ import annotations

MIN_LEAD_MS = 20
"""Never less: a hand-over takes a produce and a fetch even on an idle machine."""
DECAY = 0.98
"""Each hand-over measured shrinks the remembered worst one by this factor first."""
MARGIN = 1.5
"""The lead is this many times the recent worst hand-over."""


class DueLead:
    """The time to fire ahead of a retry's due time: the recent worst hand-over (timer to
    due agent: the due topic, the consumer, the due agent's queue and window), with a
    margin, between `MIN_LEAD_MS` and `cap_ms`.

    The due agent waits for the due time itself, so the hand-over no longer adds to a
    retry's lateness unless it takes longer than the lead. A slow hand-over (a flood of
    input, a loaded machine) widens the lead at once; quiet ones narrow it again slowly.
    `cap_ms` 0 turns firing early off.
    """

    def __init__(self, cap_ms: int) -> None:
        self.cap_ms = cap_ms
        self._worst_ms = 0.0

    def observe(self, hand_over_ms: float) -> None:
        """A due message took `hand_over_ms` from the timer to the due agent."""
        self._worst_ms = max(hand_over_ms, self._worst_ms * DECAY)

    @property
    def ms(self) -> int:
        if self.cap_ms <= 0:
            return 0
        return int(min(self.cap_ms, max(MIN_LEAD_MS, self._worst_ms * MARGIN)))
