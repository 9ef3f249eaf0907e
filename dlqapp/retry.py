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
from typing import Any, AsyncIterator, Iterable, Iterator

from aiokafka import AIOKafkaProducer
from faust import EventT, TopicT
from faust.tables import Table
from rocksdict import ReadOptions

from dlqapp.classification import ErrorClass
from dlqapp.flow import HIGH
from dlqapp.logs import log_event
from dlqapp.models import H_REPLAY_COUNT, MAX_REQUEST_ID_CHARS, Envelope, InvalidRequest, header_int, now_ms, parse_request
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

    def __init__(self, pipeline: Pipeline, parked: Table, due_hop: "DueHop") -> None:
        self.pipeline = pipeline
        self.parked = parked
        self.due_hop = due_hop
        self.fired: dict[bytes, int] = {}
        self.delays_ms = pipeline.settings.retry_delays_ms
        self.batch = pipeline.settings.timer_batch
        self.parked_by_tier: Counter[int] = Counter()
        self._counted_partitions: frozenset[int] = frozenset()
        self.scan_starts = ScanStarts()

    # -- 1. park ----------------------------------------------------------------------

    async def park(self, event: EventT, tier: int, topic: TopicT) -> None:
        """Store one tier-topic message in the due-time table."""
        request_id = _request_id(event)
        if request_id is None:
            await self.pipeline.dead_letter_invalid(event, InvalidRequest(["retry message key must be a UTF-8 request id"]))
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
        self.scan_starts.lower_to(key)

    # -- 2. fire ----------------------------------------------------------------------

    async def fire_due(self) -> int:
        """Hand every due, not yet fired retry to the due agent. Returns how many."""
        now = now_ms()
        fired = 0
        active = dict(self._active_partitions())
        self.scan_starts.keep_only(active)
        for partition, db in active.items():
            keys = self._due_keys(partition, db, now)
            if not keys:
                continue
            sends = []
            for key in keys:
                self.fired[key] = now
                _, request_id = decode_parked_key(key)
                sends.append(await self.due_hop.send(request_id.encode(), key, partition))
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

    def _due_keys(self, partition: int, db: object, now: int) -> list[bytes]:
        """Due, not yet fired keys of one partition, earliest first, at most `batch`."""
        keys, next_start = scan_due(db, now, self.scan_starts.get(partition, db), self.fired, self.batch)
        self.scan_starts.set(partition, db, next_start)
        return keys

    async def recount_if_reassigned(self) -> None:
        """After a rebalance or a restart, count parked retries per tier again."""
        partitions = frozenset(p for p, _ in self._active_partitions())
        if partitions == self._counted_partitions:
            return
        self._counted_partitions = partitions
        counts: Counter[int] = Counter()
        async for _, value in self._walk_parked(values=True):
            counts[self._tier_of(Envelope.from_bytes(value))] += 1
        self.parked_by_tier = counts

    def parked_by_tier_name(self) -> dict[str, int]:
        """Parked retries per tier topic name (without prefix), for metrics."""
        return {self.pipeline.tier_label(t.get_topic_name()): max(0, self.parked_by_tier[i]) for i, t in enumerate(self.pipeline.tier_topics)}

    async def parked_count(self) -> int:
        """Retries parked on the partitions this worker actively owns (an exact count)."""
        total = 0
        async for _ in self._walk_parked(values=False):
            total += 1
        return total

    async def _walk_parked(self, values: bool) -> AsyncIterator[tuple[bytes, bytes | None]]:
        """Every parked (key, value) on active partitions, in chunks.

        Never holds an iterator across an await (a rebalance may close the store), and
        yields to the event loop between chunks, so a table of millions of entries can
        be walked while the timer and the agents keep running.
        """
        offset_key = self.parked.data.offset_key
        for _, db in list(self._active_partitions()):
            after: bytes | None = None
            while True:
                chunk = _scan_chunk(db, after, SCAN_CHUNK, values)
                for key, value in chunk:
                    if key != offset_key:
                        yield key, value
                if len(chunk) < SCAN_CHUNK:
                    break
                after = chunk[-1][0]
                await asyncio.sleep(0)

    def forget_fired(self) -> None:
        """After a rebalance: entries may have moved; fire whatever is still parked."""
        self.fired.clear()
        self.scan_starts.clear()

    # -- 3. attempt -------------------------------------------------------------------

    async def on_due(self, event: EventT) -> None:
        """Attempt the parked retry named by a due message, then delete it."""
        key = event.value
        if not isinstance(key, bytes) or len(key) <= 8:
            raise ValueError("a due message must carry a parked-retry key")
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


SCAN_CHUNK = 5000


class DueHop:
    """Hands due keys to the due agent (the internal due topic) on a producer of its own.

    A due message is a hint, not the record: the entry stays parked until the due agent
    deletes it, and a hint lost to a crash is fired again after REFIRE_AFTER_MS. So it
    needs neither acks=all nor idempotence; what it needs is not to queue behind the
    results and changelog writes in Faust's producer, which under an input flood held
    due retries back for a few hundred milliseconds.
    """

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks=1, linger_ms=0, client_id="dlqapp-due-hop")
        await self._producer.start()

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def send(self, key: bytes, value: bytes, partition: int) -> asyncio.Future[Any]:
        """Queue one due message; the returned future resolves once the broker has it."""
        if self._producer is None:
            raise RuntimeError("DueHop.send before start()")
        return await self._producer.send(self.topic, value=value, key=key, partition=partition)


class ScanStarts:
    """Where the timer's next scan of each partition may start.

    Fired retries are deleted from the head of the table, and RocksDB keeps their
    tombstones until compaction, so a scan from the first key would wade through every
    retry fired lately. A start is a key no parked entry sorts before: a scan sets it,
    parking an earlier key lowers it, and it is dropped when the partition's store
    changes hands (after a rebalance, changelog restores may have added anything).
    """

    def __init__(self) -> None:
        self._starts: dict[int, tuple[object, bytes]] = {}

    def get(self, partition: int, db: object) -> bytes | None:
        known = self._starts.get(partition)
        return known[1] if known is not None and known[0] is db else None

    def set(self, partition: int, db: object, start: bytes) -> None:
        self._starts[partition] = (db, start)

    def lower_to(self, key: bytes) -> None:
        """A key was parked (on some partition): no start may lie above it."""
        for partition, (db, start) in self._starts.items():
            if key < start:
                self._starts[partition] = (db, key)

    def keep_only(self, partitions: Iterable[int]) -> None:
        kept = set(partitions)
        self._starts = {p: v for p, v in self._starts.items() if p in kept}

    def clear(self) -> None:
        self._starts.clear()


def scan_due(db: object, now: int, start: bytes | None, fired: dict[bytes, int], batch: int) -> tuple[list[bytes], bytes]:
    """One timer scan of a partition's parked retries (a synchronous RocksDB walk).

    Returns the keys due at `now` that were not fired (or were fired more than
    REFIRE_AFTER_MS ago), earliest first and at most `batch` of them, and where the next
    scan may start: the first key still present, or "now" when nothing due is left (a key
    parked later below that point lowers it again, see `RetryScheduler.store`).
    """
    upper = due_upper_bound(now)
    options = ReadOptions()
    options.set_iterate_upper_bound(upper)
    it = db.iter(options)  # type: ignore[attr-defined]
    if start is None:
        it.seek_to_first()
    else:
        it.seek(start)
    keys: list[bytes] = []
    first_present: bytes | None = None
    while it.valid() and len(keys) < batch:
        key = it.key()
        if first_present is None:
            first_present = key
        fired_at = fired.get(key)
        if fired_at is None or now - fired_at > REFIRE_AFTER_MS:
            keys.append(key)
        it.next()
    return keys, first_present if first_present is not None else upper


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
    replays = state.get("replay_count") or 0
    if (header_int(envelope.lineage, H_REPLAY_COUNT) or 0) < replays:
        return f"an operator replayed the request since (replay {replays})"
    if state.get("state") != states.REPROCESSED and state.get("attempts", 0) > envelope.attempts:
        return f"a newer attempt ({state['attempts']}) was already made"
    return None


def _scan_chunk(db: object, after: bytes | None, limit: int, values: bool) -> list[tuple[bytes, bytes | None]]:
    """Up to `limit` (key, value or None) pairs after `after` (exclusive), in key order."""
    it = db.iter(ReadOptions())  # type: ignore[attr-defined]
    if after is None:
        it.seek_to_first()
    else:
        it.seek(after)
        if it.valid() and it.key() == after:
            it.next()
    chunk = []
    while it.valid() and len(chunk) < limit:
        chunk.append((it.key(), it.value() if values else None))
        it.next()
    return chunk


def _request_id(event: EventT) -> str | None:
    key = event.key
    if isinstance(key, (bytes, bytearray)) and key:
        try:
            text = bytes(key).decode()
        except UnicodeDecodeError:
            return None
        return text if text.strip() and len(text) <= MAX_REQUEST_ID_CHARS else None
    return None
