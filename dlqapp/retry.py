"""Retry scheduling: park each retry in a due-time table, fire it when due.

1. When the pipeline decides a retry, it parks the envelope in `parked_retries` under
   `parked_key(due, request_id)` in the same stream step (on the partition that owns
   the request), and publishes it on the tier topic. Each tier agent parks what others
   put on its topic; its own retries are already there.
2. The retry timer scans, for each partition this worker actively owns, the keys up to
   "now" (byte order is time order) and hands each due key to the due agent through the
   internal `due` topic, on the same partition.
3. The due agent reads the parked entry, attempts the request, carries out the outcome,
   and only then deletes the entry. A crash anywhere re-fires the entry, never loses it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Iterator

from faust import EventT, TopicT
from faust.tables import Table
from rocksdict import ReadOptions

from dlqapp.classification import ErrorClass
from dlqapp.flow import HIGH
from dlqapp.logs import log_event
from dlqapp.models import Envelope, InvalidRequest, now_ms, parse_request
from dlqapp.outcomes import DeadLetter
from dlqapp.pipeline import Pipeline
from dlqapp import state as states
from dlqapp.scheduling import decode_parked_key, due_upper_bound, parked_key

log = logging.getLogger("dlqapp.retry")

REFIRE_AFTER_MS = 120_000
"""A fired entry still parked after this long (its due message was lost to a crash of
the due agent's worker mid-flight) is fired again; the due agent ignores duplicates."""


class RetryScheduler:
    """Parks retries, scans for due ones, and attempts them."""

    def __init__(self, pipeline: Pipeline, parked: Table, due_topic: TopicT) -> None:
        self.pipeline = pipeline
        self.parked = parked
        self.due_topic = due_topic
        self.fired: dict[bytes, int] = {}
        self.delays_ms = pipeline.settings.retry_delays_ms
        self.batch = pipeline.settings.timer_batch
        self.parked_by_tier: Counter[int] = Counter()
        self._counted_partitions: frozenset[int] = frozenset()

    # -- 1. park ----------------------------------------------------------------------

    async def park(self, event: EventT, tier: int, topic: TopicT) -> None:
        """Store one tier-topic message in the due-time table."""
        request_id = _request_id(event)
        if request_id is None:
            await self.pipeline.dead_letter_invalid(event, InvalidRequest(["retry message without a request id"]))
            return
        if not self.pipeline.owns(event, request_id):
            await self.pipeline.forward(event, topic, request_id)
            return
        envelope = Envelope.from_headers(request_id, event.value or b"", event.headers or {})
        if envelope.scheduled_time is None:
            envelope.scheduled_time = int(event.message.timestamp * 1000) + self.delays_ms[tier]
        self.store(envelope, tier)

    def store(self, envelope: Envelope, tier: int) -> None:
        """Park an envelope under its due time (idempotent; inside the owning partition's stream).

        dlqapp parks its own retries when it decides them (dlqapp.pipeline), in the same
        stream step that records the state, so a retry never depends on the tier topic
        being consumed; the tier agent then finds the entry already there. Retries that
        others put on a tier topic are parked by the tier agent.
        """
        assert envelope.scheduled_time is not None
        key = parked_key(envelope.scheduled_time, envelope.request_id)
        if self.parked.get(key) is not None:
            return
        self.parked_by_tier[tier] += 1
        self.parked[key] = envelope.to_bytes()

    # -- 2. fire ----------------------------------------------------------------------

    async def fire_due(self) -> int:
        """Hand every due, not yet fired retry to the due agent. Returns how many."""
        now = now_ms()
        fired = 0
        for partition, db in self._active_partitions():
            keys = list(self._due_keys(db, now))
            if not keys:
                continue
            sends = []
            for key in keys:
                self.fired[key] = now
                _, request_id = decode_parked_key(key)
                sends.append(await self.due_topic.send(key=request_id.encode(), value=key, partition=partition))
            await asyncio.gather(*sends)
            fired += len(keys)
        return fired

    def _active_partitions(self) -> Iterator[tuple[int, object]]:
        app = self.parked.app
        changelog = self.parked.changelog_topic.get_topic_name()
        store = self.parked.data
        for tp in app.assignor.assigned_actives():
            if tp.topic == changelog:
                yield tp.partition, store._db_for_partition(tp.partition)

    def _due_keys(self, db: object, now: int) -> Iterator[bytes]:
        """Due keys of one partition, earliest first, at most `batch` of them (sync scan)."""
        options = ReadOptions()
        options.set_iterate_upper_bound(due_upper_bound(now))
        it = db.iter(options)  # type: ignore[attr-defined]
        it.seek_to_first()
        taken = 0
        while it.valid() and taken < self.batch:
            key = it.key()
            fired_at = self.fired.get(key)
            if fired_at is None or now - fired_at > REFIRE_AFTER_MS:
                taken += 1
                yield key
            it.next()

    async def recount_if_reassigned(self) -> None:
        """After a rebalance or a restart, count parked retries per tier again.

        Scans in chunks, never holding an iterator across an await, so the timer and
        the agents keep running while a large table is counted.
        """
        partitions = frozenset(p for p, _ in self._active_partitions())
        if partitions == self._counted_partitions:
            return
        self._counted_partitions = partitions
        counts: Counter[int] = Counter()
        offset_key = self.parked.data.offset_key
        for partition, db in list(self._active_partitions()):
            after: bytes | None = None
            while True:
                chunk = _scan_chunk(db, after, RECOUNT_CHUNK)
                for key, value in chunk:
                    if key != offset_key:
                        counts[self._tier_of(Envelope.from_bytes(value))] += 1
                if len(chunk) < RECOUNT_CHUNK:
                    break
                after = chunk[-1][0]
                await asyncio.sleep(0)
        self.parked_by_tier = counts

    def parked_by_tier_name(self) -> dict[str, int]:
        """Parked retries per tier topic name (without prefix), for metrics."""
        return {self.pipeline.tier_label(t.get_topic_name()): max(0, self.parked_by_tier[i]) for i, t in enumerate(self.pipeline.tier_topics)}

    def parked_count(self) -> int:
        """Retries parked on the partitions this worker actively owns."""
        offset_key = self.parked.data.offset_key
        return sum(1 for _, db in self._active_partitions() for key in db.keys() if key != offset_key)  # type: ignore[attr-defined]

    def forget_fired(self) -> None:
        """After a rebalance: entries may have moved; fire whatever is still parked."""
        self.fired.clear()

    # -- 3. attempt -------------------------------------------------------------------

    async def on_due(self, event: EventT) -> None:
        """Attempt the parked retry named by a due message, then delete it."""
        key: bytes = event.value
        blob = self.parked.get(key)
        if blob is None:
            self.fired.pop(key, None)
            return
        envelope = Envelope.from_bytes(blob)
        tier = self._tier_of(envelope)
        request_id = envelope.request_id
        if request_id in self.pipeline.in_flight:
            return  # a re-fire while the first attempt is still running
        previous = self.pipeline.load_state(request_id)
        superseded = superseded_by(previous, envelope)
        if superseded is None:
            await self._attempt(envelope, tier)
        else:
            log_event(log, logging.INFO, "retry_skipped", request_id=request_id, attempt=envelope.attempts + 1, reason=superseded)
        del self.parked[key]
        self.parked_by_tier[tier] -= 1
        self.fired.pop(key, None)

    def _tier_of(self, envelope: Envelope) -> int:
        """The tier a parked envelope waits in: the one after its last failed attempt."""
        return max(0, min(envelope.attempts - 1, len(self.pipeline.tier_topics) - 1))

    async def _attempt(self, envelope: Envelope, tier: int) -> None:
        topic = self.pipeline.tier_topics[tier].get_topic_name()
        try:
            request = parse_request(envelope.payload, self.pipeline.settings.max_payload_bytes)
        except InvalidRequest as exc:
            await self.pipeline.carry_out(DeadLetter(ErrorClass.INVALID_REQUEST, f"invalid request: {exc}"), envelope, None, None)
            return
        await self.pipeline.attempt(envelope, request, topic, priority=HIGH)


RECOUNT_CHUNK = 5000


def superseded_by(state: dict | None, envelope: Envelope) -> str | None:
    """Why a parked retry should not run, or None when it should.

    After a crash, at-least-once delivery can leave two copies of a request's retry
    chain. The request's state (written in the same partition as every attempt) tells
    which copy is current: a retry is stale once the request succeeded or once the
    state has recorded more attempts than the retry carries.
    """
    if state is None:
        return None
    if state.get("state") == states.SUCCEEDED:
        return "already succeeded"
    if state.get("state") != states.REPROCESSED and state.get("attempts", 0) > envelope.attempts:
        return f"a newer attempt ({state['attempts']}) was already made"
    return None


def _scan_chunk(db: object, after: bytes | None, limit: int) -> list[tuple[bytes, bytes]]:
    """Up to `limit` (key, value) pairs after `after` (exclusive), in key order."""
    it = db.iter(ReadOptions())  # type: ignore[attr-defined]
    if after is None:
        it.seek_to_first()
    else:
        it.seek(after)
        if it.valid() and it.key() == after:
            it.next()
    chunk = []
    while it.valid() and len(chunk) < limit:
        chunk.append((it.key(), it.value()))
        it.next()
    return chunk


def _request_id(event: EventT) -> str | None:
    key = event.key
    if isinstance(key, (bytes, bytearray)) and key:
        try:
            return bytes(key).decode()
        except UnicodeDecodeError:
            return None
    return None
