"""Retry scheduling: park each retry in a due-time table, hand it over when due.

1. When the pipeline decides a retry, `RetryParking.park` (dlqapp.retries.tier_parking) parks the envelope in
   `parked_retries` under `parked_key(due, request_id)`, records the request's state
   `retry_scheduled` and publishes it on the tier topic, in the same stream step (on the
   partition that owns the request). Each tier agent parks what others
   put on its topic; its own retries are already there.
2. The retry timer scans, for each partition this worker actively owns, the keys up to
   "now" (byte order is time order) and hands each due key to the due agent through the
   internal `due` topic, on the same partition.
3. The due agent reads the parked entry, attempts the request, carries out the outcome,
   and only then deletes the entry. A crash anywhere hands the entry over again, never loses it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Protocol

from faust import TopicT
from rocksdict import Rdict

from dlqapp.core import states
from dlqapp.core.clock import Clock, sleep_until
from dlqapp.core.envelope import Envelope
from dlqapp.core.errors import ErrorClass
from dlqapp.core.headers import H_REPLAY_COUNT, header_int
from dlqapp.core.in_flight import InFlight
from dlqapp.core.outcomes import DeadLetter
from dlqapp.core.record import Record
from dlqapp.core.requests import MAX_REQUEST_ID_CHARS, InvalidRequest, Request, parse_request
from dlqapp.core.states import StoredState
from dlqapp.core.tiers import Tier
from dlqapp.deadletters.writer import DeadLetterWriter
from dlqapp.flowcontrol.input_gate import InputGate
from dlqapp.flowcontrol.slots import DUE, PRIORITIES
from dlqapp.kafka.faust_tables import is_offset_record, scan_chunk
from dlqapp.observability.logs import log_event
from dlqapp.retries.handover import HandOver, is_run_now
from dlqapp.retries.keys import decode_parked_key
from dlqapp.retries.lead import DueLead
from dlqapp.retries.parked import ParkedRetries
from dlqapp.retries.scan import REFIRE_AFTER_MS, SCAN_CHUNK, QuietPartitions, next_due_after, scan_due
from dlqapp.tables.request_store import RequestStore

log = logging.getLogger("dlqapp.retries.scheduler")

SLOT_AHEAD_MS = 100
"""A retry handed over early (DueLead) takes its backend slot this long before its due time
and holds it until then: under a flood every slot is busy with fresh input, and a retry that
asked for one only when due waited for the next call to end (up to a call's latency)."""

HELD_TOPIC = "budget_held"
"""The `topic` of an attempt made when a request held over its budget is released."""

PREVIOUS_ATTEMPT_WAIT_S = 30.0
"""How long a handed-over retry waits for the request's previous attempt to finish its step."""


class AttemptRunner(Protocol):
    """Attempts a request and carries out the outcome (`dlqapp.processing.pipeline.Pipeline.attempt`)."""

    def __call__(
        self,
        envelope: Envelope,
        request: Request,
        *,
        topic: str,
        tier: Tier | None,
        priority: int,
        not_before: int | None = None,
    ) -> Awaitable[None]: ...


class RetryScheduler:
    """Parks retries from tier topics, fires due ones, and attempts them."""

    def __init__(
        self,
        parked: ParkedRetries,
        attempt: AttemptRunner,
        *,
        dead_letters: DeadLetterWriter,
        in_flight: InFlight,
        store: RequestStore,
        handover: HandOver,
        gate: InputGate,
        batch: int,
        max_payload_bytes: int,
        clock: Clock,
        lead: DueLead | None = None,
    ) -> None:
        self.parked = parked
        self.attempt = attempt
        self.dead_letters = dead_letters
        self.in_flight = in_flight
        self.store = store
        self.handover = handover
        self.gate = gate
        self.batch = batch
        self.max_payload_bytes = max_payload_bytes
        self.clock = clock
        self.lead = lead or DueLead(0)
        self.handed_over: dict[bytes, int] = {}
        self.running: set[bytes] = set()
        """Parked keys being attempted by the due agent or dead-lettered by an operator now:
        a second due message for one of them (the timer and "run now" at once) is ignored."""
        self.quiet = QuietPartitions()
        self.next_due: int | None = None
        """When the earliest retry not yet handed over falls due (as of the last scan), so
        the timer can wake for it (`next_hand_over_at`) instead of a tick later."""

    # -- 1. park ----------------------------------------------------------------------

    async def park(self, record: Record, tier: Tier, topic: TopicT) -> None:
        """Store one tier-topic message in the due-time table."""
        request_id = _request_id(record)
        if request_id is None:
            reason = f"invalid request: {InvalidRequest(['retry message key must be a UTF-8 request id'])}"
            await self.dead_letters.write_unprocessable(record, ErrorClass.INVALID_REQUEST, reason)
            return
        if not self.store.owns(record, request_id):
            await self.store.forward(record, topic, request_id)
            return
        envelope = Envelope.from_headers(request_id, record.payload or b"", record.headers)
        if envelope.due_ms is None:
            envelope.due_ms = record.timestamp_ms + tier.delay_ms
        if superseded_by(self.store.load_state(request_id), envelope) is not None:
            return  # the retry ran already (its own tier message read late) or the request moved on
        self.parked.store(envelope, tier)

    # -- 2. fire ----------------------------------------------------------------------

    @property
    def next_hand_over_at(self) -> int | None:
        """When the timer should next hand retries over: the next due time, less the lead."""
        return None if self.next_due is None else self.next_due - self.lead.ms

    async def hand_over_due(self) -> int:
        """Hand every retry due within the lead (see DueLead), not yet fired, to the due agent. Returns how many.

        Every partition's hints are queued before the tick waits for the broker once: a wait
        per partition made a tick take one round trip per partition, and on a busy worker the
        last partitions' retries were handed over after their due time."""
        now = self.clock()
        horizon = now + self.lead.ms
        active = dict(self.parked.active_dbs())
        self.parked.scan_starts.keep_only(active)
        upcoming: list[int] = []
        due_now: list[tuple[int, list[bytes]]] = []
        for partition, db in active.items():
            keys, next_due = self._scan(partition, db, horizon)
            if keys:
                due_now.append((partition, keys))
            if next_due is not None:
                upcoming.append(next_due)
        self.next_due = min(upcoming, default=None)
        sends = []
        for partition, keys in due_now:
            self.gate.handed_over(keys)  # fresh input waits until the due agent has these
            for key in keys:
                self.handed_over[key] = now
                _, request_id = decode_parked_key(key)
                sends.append(await self.handover.send(request_id.encode(), key, partition))
        if sends:
            await asyncio.gather(*sends)
        self.gate.refresh()
        return len(sends)

    async def hand_over_now(self, key: bytes, partition: int) -> None:
        """Hand one parked retry to the due agent now, exactly as the timer would when it is due."""
        self.handed_over[key] = self.clock()
        self.gate.handed_over([key])  # like the timer's fires: fresh input waits until the due agent has it
        _, request_id = decode_parked_key(key)
        try:
            await (await self.handover.send(request_id.encode(), key, partition, now=True))
        except BaseException:
            self.handed_over.pop(key, None)
            raise

    async def release_held(self) -> int:
        """Hand every request held over its budget to the due agent now (a budget was raised):
        each is looked at again at once, and held again if it still does not fit. Returns how many."""
        released = 0
        for partition, db in list(self.parked.active_dbs()):
            after: bytes | None = None
            while True:
                chunk = scan_chunk(db, after, SCAN_CHUNK, True)
                for key, value in chunk:
                    if is_offset_record(self.parked.table, key) or not value or b'"budget_held"' not in value:
                        continue
                    if Envelope.from_bytes(value).held and not self.is_handed_over(key):
                        await self.hand_over_now(key, partition)
                        released += 1
                if len(chunk) < SCAN_CHUNK:
                    break
                after = chunk[-1][0]
                await asyncio.sleep(0)
        return released

    def is_handed_over(self, key: bytes) -> bool:
        """Handed to the due agent lately (not yet done), or being attempted now."""
        handed_over_at = self.handed_over.get(key)
        return key in self.running or (handed_over_at is not None and self.clock() - handed_over_at <= REFIRE_AFTER_MS)

    def _scan(self, partition: int, db: Rdict, horizon: int) -> tuple[list[bytes], int | None]:
        """One partition's keys due by `horizon` (see `_due_keys`), and the earliest due time
        after it; a quiet partition is not walked (`QuietPartitions`)."""
        if not self.handed_over and (known := self.quiet.still_quiet(partition, db, horizon)) is not None:
            return [], known.next_due
        written = db.latest_sequence_number()
        keys = self._due_keys(partition, db, horizon)
        next_due = next_due_after(db, horizon)
        if keys or self.handed_over:
            self.quiet.forget(partition)
        else:
            self.quiet.note(partition, db, written, next_due)
        return keys, next_due

    def _due_keys(self, partition: int, db: Rdict, horizon: int) -> list[bytes]:
        """Keys of one partition due by `horizon`, not yet fired, earliest first, at most `batch`."""
        starts = self.parked.scan_starts
        keys, next_start = scan_due(
            db, horizon, start=starts.get(partition, db), fired=self.handed_over, batch=self.batch
        )
        starts.set(partition, db, next_start)
        return keys

    def forget_handed_over(self) -> None:
        """After a rebalance: entries may have moved; fire whatever is still parked."""
        self.handed_over.clear()
        self.parked.scan_starts.clear()
        self.quiet.clear()
        self.gate.forget()

    # -- 3. attempt -------------------------------------------------------------------

    async def on_due(self, record: Record) -> None:
        """Attempt the parked retry named by a due message, then delete it."""
        key = record.payload
        if not isinstance(key, bytes) or len(key) <= 8:  # written by something else than the timer
            reason = "invalid due message: it must carry a parked-retry key (the timer writes this topic)"
            await self.dead_letters.write_unprocessable(record, ErrorClass.INVALID_REQUEST, reason)
            return
        self.gate.received(key)
        handed_over_at = self.handed_over.get(key)
        if handed_over_at is not None:
            self.lead.observe(self.clock() - handed_over_at)
        if key in self.running:
            return  # a re-fire (or "run now") while this retry's attempt is still running
        envelope = self.parked.get(key)
        if envelope is None:
            self.handed_over.pop(key, None)
            return
        request_id = envelope.request_id
        if request_id in self.in_flight:
            # The attempt that parked this retry is still finishing its step (the timer hands
            # a retry over up to DLQ_DUE_LEAD_MAX early). Waiting for it, rather than dropping
            # this hand-over, keeps the retry on time: a dropped one waited REFIRE_AFTER_MS.
            if not await self.in_flight.wait_until_idle(request_id, PREVIOUS_ATTEMPT_WAIT_S) or key in self.running:
                self.handed_over.pop(key, None)  # still busy: the timer hands it over again
                return
            envelope = self.parked.get(key)
            if envelope is None:
                self.handed_over.pop(key, None)
                return
        self.running.add(key)
        try:
            due = None if is_run_now(record.headers) else decode_parked_key(key)[0]
            if due is not None:
                await sleep_until(self.clock, due - SLOT_AHEAD_MS)
            tier = self.parked.tier_of(envelope)  # before the attempt adds to the envelope's count
            superseded = superseded_by(self.store.load_state(request_id), envelope)
            if superseded is None:
                await self._attempt(envelope, tier, not_before=due)
            else:
                log_event(
                    log,
                    logging.INFO,
                    "retry_skipped",
                    request_id=request_id,
                    attempt=envelope.attempts + 1,
                    reason=superseded,
                )
            self.parked.delete(key, tier)
            self.handed_over.pop(key, None)
        finally:
            self.running.discard(key)

    async def _attempt(self, envelope: Envelope, tier: Tier, not_before: int | None) -> None:
        try:
            request = parse_request(envelope.payload, self.max_payload_bytes)
        except InvalidRequest as exc:
            await self.dead_letters.write(DeadLetter(ErrorClass.INVALID_REQUEST, f"invalid request: {exc}"), envelope)
            return
        if envelope.held:  # held over its budget: looked at again as the request it was, at its own priority
            envelope.held = False
            envelope.due_ms = None
            await self.attempt(envelope, request, topic=HELD_TOPIC, tier=None, priority=PRIORITIES[request.priority])
            return
        await self.attempt(envelope, request, topic=tier.topic, tier=tier, priority=DUE, not_before=not_before)


def superseded_by(state: StoredState | None, envelope: Envelope) -> str | None:
    """Why a parked retry should not run, or None when it should.

    After a crash, at-least-once delivery can leave two copies of a request's retry
    chain. The request's state (written in the same partition as every attempt) tells
    which copy is current: a retry is stale once the request succeeded or once the
    state has recorded more attempts than the retry carries.
    """
    if state is None:
        return None
    if state.state == states.SUCCEEDED:
        return "already succeeded"
    replays = state.replay_count
    if (header_int(envelope.lineage, H_REPLAY_COUNT) or 0) < replays:
        return f"an operator replayed the request since (replay {replays})"
    if state.state != states.REPROCESSED and state.attempts > envelope.attempts:
        return f"a newer attempt ({state.attempts}) was already made"
    if state.state == states.DEAD_LETTERED and state.attempts == envelope.attempts > 0:
        return "it was dead-lettered since (by an operator's dead-letter now)"
    return None


def _request_id(record: Record) -> str | None:
    key = record.key
    if key:
        try:
            text = key.decode()
        except UnicodeDecodeError:
            return None
        return text if text.strip() and len(text) <= MAX_REQUEST_ID_CHARS else None
    return None
