"""Crash-loop guard: a message that kills the worker again and again becomes `poison`.

Handler exceptions are already dead-lettered as `poison` (dlqapp.processing.flow); this is for the
deaths nothing can catch (a crash in a C extension, the OOM killer). Like Kafka Streams'
processing-exception handler and Karafka's poison-pill handling, but for the process:

1. A journal in the data dir says whether the last run stopped cleanly and, about once a
   second, the messages being handled on each partition and the highest offset handed to
   a handler (the input feed takes events out of offset order, each tenant in its turn).
2. After an unclean stop, the messages that were being handled, and those past the highest
   offset up to a margin (started in the last second), are handled *carefully*: one at a
   time, each named in the journal before it runs. Whatever kills the worker in careful
   mode is therefore named at the next start.
   A run that died within seconds of its first message, naming none (a crash loop whose
   culprit lies past the margin), doubles the margin for the next; any other unclean
   stop (a kill -9, an OOM kill after hours) resets it.
3. A message named at the last `DLQ_POISON_AFTER_CRASHES` unclean stops in a row is not
   handled again: it is dead-lettered as `poison`, with that count as its error.

Careful handling lets a message run alone for at most `CAREFUL_TIMEOUT_S`; one that
takes longer (held by the breaker) did not kill the worker, and the rest go on.

The journal is written by a thread of its own, in order, never on the event loop: a write
of a few kilobytes took 1 ms, and up to 20 ms on a busy disk, and the first messages of
every partition each wrote one, just when the first retries of a tier fell due. A message
that must be named before it runs (one handled carefully, or any of a partition's while
its first write is under way) awaits that write; the once-a-second snapshot does not. A
write that fails is logged and never fails a message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from contextlib import asynccontextmanager
from typing import Any

from dlqapp.observability.file_writer import FileWriter
from dlqapp.observability.logs import log_event

log = logging.getLogger("dlqapp.processing.crashguard")

CAREFUL_TIMEOUT_S = 5.0
MARGIN = 128
MAX_MARGIN = 8192
MAX_QUEUED_SNAPSHOTS = 2
QUICK_DEATH_MS = 5000
"""A run that died this soon after its first message is treated as a crash loop."""
Position = tuple[str, int, int]


async def wait_written(written: Future[None]) -> None:
    """Wait for a queued journal write. A waiter cancelled meanwhile never cancels the write
    itself (others may wait for it, and the journal must get it)."""
    await asyncio.shield(asyncio.wrap_future(written))


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
        self._careful_from: dict[str, int] = {}
        self._careful_running: dict[str, set[int]] = {}
        self._running: dict[tuple[str, int], set[int]] = {}
        self._previous_running: dict[str, list[int]] = {}
        self._crashes: dict[str, int] = {}
        self._highs: dict[tuple[str, int], int] = {}
        self._current: Position | None = None
        self._closed = False
        self._margin = 0
        self._previous_highs: dict[str, int] = {}
        self._first_handled_at: int | None = None
        self._lock = asyncio.Lock()
        self._writer = FileWriter("dlqapp-journal")
        self._naming: dict[tuple[str, int], Future[None] | None] = {}
        """Each partition's first journal write, until it is done."""
        self._pending: list[Future[None]] = []
        """Writes queued and not yet known to be done (kept on the loop's thread only)."""

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
            self._careful_from = dict(self._previous_highs)
            self._careful_until = {tp: offset + margin for tp, offset in self._previous_highs.items()}
            running = previous.get("running")
            if isinstance(running, dict):
                self._careful_running = {tp: {int(o) for o in offsets} for tp, offsets in running.items()}
            else:  # a journal of an older release: everything up to the highest offset
                self._careful_from = {tp: -1 for tp in self._previous_highs}
            log_event(
                log,
                logging.WARNING,
                "unclean_stop_detected",
                careful_partitions=len(self._careful_until),
                suspects=json.dumps(self._crashes),
            )
        self._write(clean=False)

    def close(self) -> None:
        """A clean stop: the next start handles everything normally (written before this returns)."""
        self._closed = True
        self.flush()
        self._write(clean=True)
        self._writer.close()

    def flush(self) -> None:
        """Wait until every journal write queued so far is done (or failed)."""
        self._writer.flush()

    def crashes(self, position: Position) -> int:
        """How many unclean stops in a row happened while this message was being handled."""
        return self._crashes.get(_key(position), 0)

    def is_poison(self, position: Position) -> bool:
        return bool(self._crashes) and self.crashes(position) >= self.after_crashes

    def seen(self, position: Position) -> Future[None] | None:
        """A message was handed to a handler (feeds the once-a-second journal). Returns the
        journal write to wait for before it runs while its partition's first write is under
        way: a crash on a partition's first messages must be found too."""
        topic, partition, offset = position
        tp = (topic, partition)
        self._running.setdefault(tp, set()).add(offset)
        high = self._highs.get(tp)
        if high is None:
            if self._first_handled_at is None:
                self._first_handled_at = _now_ms()
            self._highs[tp] = offset
            naming = self._naming[tp] = self._write_soon()
            return naming
        if offset > high:
            self._highs[tp] = offset
        naming = self._naming.get(tp)
        if naming is not None and naming.done():
            del self._naming[tp]
            return None
        return naming

    def finished(self, position: Position) -> None:
        """The message's handler is done (whatever its outcome)."""
        topic, partition, offset = position
        running = self._running.get((topic, partition))
        if running is not None:
            running.discard(offset)

    def snapshot(self) -> None:
        """Persist what is being handled (called about once a second); skipped while two writes
        are still under way (the second carries nearly everything), so a stalled disk does not
        pile them up."""
        if sum(1 for written in self._pending if not written.done()) < MAX_QUEUED_SNAPSHOTS:
            self._write_soon()

    def needs_care(self, position: Position) -> bool:
        """Whether the message was being handled at the unclean stop, or may have started after
        the journal's last word (past the highest offset then, within the margin)."""
        if not self._careful_until:
            return False
        topic, partition, offset = position
        tp = f"{topic}:{partition}"
        if offset in self._careful_running.get(tp, ()):
            return True
        limit = self._careful_until.get(tp)
        return limit is not None and self._careful_from.get(tp, -1) < offset <= limit

    @asynccontextmanager
    async def careful(self, position: Position) -> AsyncIterator[None]:
        """Run the block alone, named in the journal, for at most CAREFUL_TIMEOUT_S."""
        await self._lock.acquire()
        self._current = position
        timer: asyncio.TimerHandle | None = None
        try:
            named = self._write_soon()
            if named is not None:
                await wait_written(named)  # named on disk before it runs
            timer = asyncio.get_running_loop().call_later(CAREFUL_TIMEOUT_S, self._let_others_go, position)
            yield
        finally:
            if timer is not None:
                timer.cancel()
            self._let_others_go(position)

    def _let_others_go(self, position: Position) -> None:
        if self._current != position:
            return  # already let go (timed out)
        self._current = None
        self._write_soon()  # queued before the next careful message's own
        self._lock.release()

    def _read(self) -> dict[str, Any] | None:
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _write_soon(self) -> Future[None] | None:
        """Queue a write of the journal as it stands now (None after `close`)."""
        if self._closed:
            return None
        written = self._writer.submit(self._store_queued, self._state(clean=False))
        self._pending = [*(w for w in self._pending if not w.done()), written]
        return written

    def _store_queued(self, state: dict[str, Any]) -> None:
        """(On the journal's thread.) A queued write; one that fails is logged, never raised: a
        message must not fail because the journal could not be written, and the guard goes on
        with the journal as it was."""
        try:
            self._store(state)
        except OSError as exc:
            log_event(log, logging.WARNING, "crash_journal_not_written", error=repr(exc))

    def _write(self, clean: bool) -> None:
        """Write the journal now, on the caller's thread (at start and at a clean stop)."""
        self._store(self._state(clean))

    def _state(self, clean: bool) -> dict[str, Any]:
        """The journal's content now (copies: it is written on another thread)."""
        return {
            "clean": clean or self._closed,
            "highs": {
                **self._previous_highs,
                **{f"{topic}:{partition}": offset for (topic, partition), offset in self._highs.items()},
            },
            "running": {
                f"{topic}:{partition}": sorted(offsets)
                for (topic, partition), offsets in self._running.items()
                if offsets
            },
            "current": list(self._current) if self._current else None,
            "crashes": dict(self._crashes),
            "margin": self._margin,
            "first_handled_at": self._first_handled_at,
            "written_at": _now_ms(),
        }

    def _store(self, state: dict[str, Any]) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        temporary = self.path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(state, f)
        os.replace(temporary, self.path)
