"""Crash-loop guard: a message that kills the worker again and again becomes `poison`.

Handler exceptions are already dead-lettered as `poison` (dlqapp.processing.flow); this is for the
deaths nothing can catch (a crash in a C extension, the OOM killer). Like Kafka Streams'
processing-exception handler and Karafka's poison-pill handling, but for the process:

1. A journal in the data dir says whether the last run stopped cleanly and, about once a
   second, the highest offset handed to a handler on each partition.
2. After an unclean stop, the messages up to those offsets (plus a margin for the last
   second) are handled *carefully*: one at a time, each named in the journal before it
   runs. Whatever kills the worker in careful mode is therefore named at the next start.
   A run that died within seconds of its first message, naming none (a crash loop whose
   culprit lies past the margin), doubles the margin for the next; any other unclean
   stop (a kill -9, an OOM kill after hours) resets it.
3. A message named at the last `DLQ_POISON_AFTER_CRASHES` unclean stops in a row is not
   handled again: it is dead-lettered as `poison`, with that count as its error.

Careful handling lets a message run alone for at most `CAREFUL_TIMEOUT_S`; one that
takes longer (held by the breaker) did not kill the worker, and the rest go on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from dlqapp.observability.logs import log_event

log = logging.getLogger("dlqapp.processing.crashguard")

CAREFUL_TIMEOUT_S = 5.0
MARGIN = 128
MAX_MARGIN = 8192
QUICK_DEATH_MS = 5000
"""A run that died this soon after its first message is treated as a crash loop."""
Position = tuple[str, int, int]


class PoisonMessage(Exception):
    """The worker died while handling this message at its last unclean stops."""


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _key(position: Position) -> str:
    topic, partition, offset = position
    return f"{topic}:{partition}:{offset}"


class CrashGuard:
    """The journal and the careful mode of one worker process."""

    def __init__(self, path: str, after_crashes: int) -> None:
        self.path = path
        self.after_crashes = after_crashes
        self._careful_until: dict[str, int] = {}
        self._crashes: dict[str, int] = {}
        self._highs: dict[tuple[str, int], int] = {}
        self._current: Position | None = None
        self._written_highs: dict[tuple[str, int], int] = {}
        self._closed = False
        self._margin = 0
        self._previous_highs: dict[str, int] = {}
        self._first_handled_at: int | None = None
        self._lock = asyncio.Lock()

    def open(self) -> None:
        """Read what the last run left, then mark this run as not (yet) stopped cleanly."""
        previous = self._read()
        if previous and not previous.get("clean", True):
            current = previous.get("current")
            counts = previous.get("crashes", {})
            margin = int(previous.get("margin", 0))
            first, last = previous.get("first_handled_at"), previous.get("written_at")
            quick = isinstance(first, int) and isinstance(last, int) and last - first < QUICK_DEATH_MS
            if current:
                key = _key(tuple(current))
                self._crashes = {key: int(counts.get(key, 0)) + 1}
                margin = max(MARGIN, margin)
            elif quick:  # a crash loop whose culprit ran past the last snapshot: look further
                margin = min(max(MARGIN, margin * 2), MAX_MARGIN)
            else:
                margin = MARGIN
            self._margin = margin
            self._previous_highs = {tp: int(offset) for tp, offset in previous.get("highs", {}).items()}
            self._careful_until = {tp: offset + margin for tp, offset in self._previous_highs.items()}
            log_event(
                log,
                logging.WARNING,
                "unclean_stop_detected",
                careful_partitions=len(self._careful_until),
                suspects=json.dumps(self._crashes),
            )
        self._write(clean=False)

    def close(self) -> None:
        """A clean stop: the next start handles everything normally."""
        self._closed = True
        self._write(clean=True)

    def crashes(self, position: Position) -> int:
        """How many unclean stops in a row happened while this message was being handled."""
        return self._crashes.get(_key(position), 0)

    def is_poison(self, position: Position) -> bool:
        return bool(self._crashes) and self.crashes(position) >= self.after_crashes

    def seen(self, position: Position) -> None:
        """A message was handed to a handler (feeds the once-a-second high-water marks)."""
        topic, partition, offset = position
        tp = (topic, partition)
        high = self._highs.get(tp)
        if high is None:
            if self._first_handled_at is None:
                self._first_handled_at = _now_ms()
            self._highs[tp] = offset
            self._write(clean=False)  # at once: a crash on the first message must be found too
        elif offset > high:
            self._highs[tp] = offset

    def snapshot(self) -> None:
        """Persist the high-water marks (called about once a second)."""
        if self._highs != self._written_highs:
            self._write(clean=False)

    def needs_care(self, position: Position) -> bool:
        if not self._careful_until:
            return False
        topic, partition, offset = position
        limit = self._careful_until.get(f"{topic}:{partition}")
        return limit is not None and offset <= limit

    @asynccontextmanager
    async def careful(self, position: Position) -> AsyncIterator[None]:
        """Run the block alone, named in the journal, for at most CAREFUL_TIMEOUT_S."""
        await self._lock.acquire()
        self._current = position
        self._write(clean=False)
        timer = asyncio.get_running_loop().call_later(CAREFUL_TIMEOUT_S, self._let_others_go, position)
        try:
            yield
        finally:
            timer.cancel()
            self._let_others_go(position)

    def _let_others_go(self, position: Position) -> None:
        if self._current != position:
            return  # already let go (timed out)
        self._current = None
        self._write(clean=False)
        self._lock.release()

    def _read(self) -> dict[str, Any] | None:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _write(self, clean: bool) -> None:
        state = {
            "clean": clean or self._closed,
            "highs": {
                **self._previous_highs,
                **{f"{topic}:{partition}": offset for (topic, partition), offset in self._highs.items()},
            },
            "current": list(self._current) if self._current else None,
            "crashes": self._crashes,
            "margin": self._margin,
            "first_handled_at": self._first_handled_at,
            "written_at": _now_ms(),
        }
        self._written_highs = dict(self._highs)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        temporary = self.path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(state, f)
        os.replace(temporary, self.path)
