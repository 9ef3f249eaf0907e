"""Every offset a worker is handed, in order: a hole in a partition's offsets is made visible.

Kafka numbers the records of a partition without holes unless a producer used
transactions (each commit or abort marker takes an offset) or the topic is compacted. A
worker that receives offset 41 and then 44 of an `input` partition written without
transactions was never handed 42 and 43: if their offsets are then committed, those
requests are lost without a trace. The watch counts such holes per topic
(`dlqapp_consumer_offset_gaps_total`) and logs each one with its partition and offsets,
so an operator can find the records (`kafka-console-consumer --partition --offset`) and
replay them.

A re-delivery (an offset at or below the last one seen, after a rebalance or a seek back
to the committed offset) is normal under at-least-once delivery and not counted. Input
written with transactions leaves one such hole per transaction, so the log line comes at
most once a minute per topic, with the number of holes since the last one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from dlqapp.observability.logs import log_event

log = logging.getLogger(__name__)

OnGap = Callable[[str, int], None]
"""Called with the topic and how many offsets were skipped."""


class OffsetWatch:
    """The last offset handed over per partition; notices when the next one skips ahead."""

    def __init__(
        self,
        on_gap: OnGap,
        *,
        clock: Callable[[], float] = time.monotonic,
        log_every_s: float = 60.0,
        level: int = logging.WARNING,
    ) -> None:
        self._last: dict[tuple[str, int], int] = {}
        self._on_gap = on_gap
        self._clock = clock
        self._log_every_s = log_every_s
        self._logged_at: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}
        self._level = level
        """WARNING; DEBUG under exactly_once, where dlqapp's own transactions leave a hole per commit."""
        self.gaps = 0

    def seen(self, topic: str, partition: int, offset: int) -> int:
        """Record that `offset` was handed over; returns how many offsets it skipped (0 normally)."""
        key = (topic, partition)
        last = self._last.get(key)
        self._last[key] = offset
        if last is None or offset <= last + 1:
            return 0
        skipped = offset - last - 1
        self.gaps += 1
        self._on_gap(topic, skipped)
        now = self._clock()
        if now - self._logged_at.get(topic, float("-inf")) >= self._log_every_s:
            self._logged_at[topic] = now
            more = self._unlogged.pop(topic, 0)
            log_event(
                log,
                self._level,
                "offset_gap",
                topic=topic,
                partition=partition,
                after=last,
                next=offset,
                skipped=skipped,
                holes_since_last_line=more or None,
            )
        else:
            self._unlogged[topic] = self._unlogged.get(topic, 0) + 1
        return skipped

    def reset(self) -> None:
        """After a rebalance partitions restart from their committed offsets: no baseline."""
        self._last.clear()
