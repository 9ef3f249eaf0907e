"""How a dead letter is written: the one place a message goes to the `dlq` topic.

Two kinds: a request whose retries ended (`write`: its envelope, history and final error,
and its state moved to `dead_lettered`), and a message dlqapp cannot handle at all
(`write_unprocessable`: invalid, or `poison`, with its own bytes and headers).
"""

from __future__ import annotations

import hashlib
import json
import logging

from faust import TopicT

from dlqapp.core import states
from dlqapp.core.clock import Clock
from dlqapp.core.envelope import Envelope, carried_on, lineage_of
from dlqapp.core.errors import ErrorClass
from dlqapp.core.headers import (
    H_ORIGINAL_HEADERS,
    H_PAYLOAD_BYTES,
    H_PAYLOAD_NULL,
    H_PAYLOAD_TRUNCATED,
    H_REPLAY_COUNT,
    H_SOURCE,
    header_int,
    header_json,
)
from dlqapp.core.in_flight import InFlight
from dlqapp.core.outcomes import DeadLetter
from dlqapp.core.record import Record
from dlqapp.core.requests import fallback_key, salvage_request_id
from dlqapp.deadletters.entries import PREVIEW_BYTES, unprocessable_key
from dlqapp.kafka.transaction_errors import RecordTooLarge
from dlqapp.observability.logs import log_event
from dlqapp.tables.request_store import RequestStore

log = logging.getLogger("dlqapp.deadletters.writer")

MAX_ORIGINAL_HEADERS_CHARS = 65536


def ends_its_chain(state: states.StoredState | None, record: Record, error_class: ErrorClass) -> bool:
    """Whether dead-lettering `record` (invalid, or poison) ends its request's chain: the id was
    never seen; or the record is the operator's replay the request waits for; or, poison, the
    request's stored attempt was left in flight (its own message broke its handler)."""
    if state is None:
        return True
    if state.state == states.REPROCESSED:
        return (header_int(record.headers, H_REPLAY_COUNT) or 0) == state.replay_count
    return error_class is ErrorClass.POISON and state.state == states.IN_FLIGHT


class DeadLetterWriter:
    """Sends dead letters to `dlq` (confirmed by the broker) and records the request's state."""

    def __init__(self, store: RequestStore, dlq: TopicT, *, in_flight: InFlight, clock: Clock) -> None:
        self.store = store
        self.dlq = dlq
        self.in_flight = in_flight
        self.clock = clock

    async def write(self, outcome: DeadLetter, envelope: Envelope) -> None:
        """Dead-letter a request (its retries ended, it expired, or an operator said so)."""
        at = await self._send(outcome, envelope)
        self.store.set_state(
            envelope.request_id,
            states.DEAD_LETTERED,
            at,
            attempts=envelope.attempts,
            error_class=outcome.error_class.value,
            final_error=outcome.reason,
        )
        if envelope.spent.nusd:  # money spent on a request that still failed (a replay takes it back)
            self.store.counters.add(f"cost_failed|{outcome.error_class.value}", envelope.spent.nusd)

    async def write_unprocessable(
        self, record: Record, error_class: ErrorClass, reason: str, *, request_id: str | None = None
    ) -> None:
        """Dead-letter a message dlqapp cannot handle (invalid, or `poison`: its handler failed).

        Its DLQ key is its own (`<request id>~<class>~<digest of its position>`), so it
        never replaces another dead letter of the same request id on the compacted
        `dlq` topic; it sits on that id's partition and `GET /dlq/<request id>/` finds
        it. It ends the request's state only when the message was the request's live chain
        (`ends_its_chain`): an invalid copy of a request that succeeded, is being retried
        or is in flight leaves it as it is.
        """
        payload = record.payload
        request_id = request_id or salvage_request_id(payload)
        source = header_json(record.headers, H_SOURCE, dict) or record.source  # forwarded: where it was written
        # the record's own position too: a `source` header a producer set is not trusted to be unique
        where = f"{source.get('topic')}:{source.get('partition')}:{source.get('offset')}|{record.position}"
        position = hashlib.sha256(where.encode()).hexdigest()[:12]
        if request_id:
            key, owner = unprocessable_key(request_id, error_class.value, position), request_id
        else:
            key = (
                fallback_key(payload)
                if error_class is ErrorClass.INVALID_REQUEST
                else f"{error_class.value}-{position}"
            )
            owner = key
        envelope = Envelope(
            request_id=request_id or key,
            payload=payload or b"",
            original_timestamp=record.timestamp_ms,
            source=source,
            lineage=carried_on(record.headers),
        )
        envelope.last_error = reason
        extra = {
            H_ORIGINAL_HEADERS: json.dumps(dict(record.headers), separators=(",", ":"))[:MAX_ORIGINAL_HEADERS_CHARS]
        }
        if payload is None:
            extra[H_PAYLOAD_NULL] = "true"
        partition = self.store.owner(owner)
        await self._send(DeadLetter(error_class, reason), envelope, key=key, partition=partition, **extra)
        if (
            request_id
            and partition == record.partition
            and request_id not in self.in_flight
            and ends_its_chain(self.store.load_state(request_id), record, error_class)
        ):
            self.store.set_state(  # counts the dead letter with the state change
                request_id,
                states.DEAD_LETTERED,
                self.clock(),
                error_class=error_class.value,
                final_error=reason[:500],
                dlq_key=key,
            )
        else:  # a copy beside a live request, or a record without an id: its dead letter counts alone
            self.store.counters.add(f"dead_lettered|{error_class.value}")
            if not request_id and not lineage_of(record.headers):
                self.store.counters.add("received")  # no id to keep a state under, but it did arrive
        log_event(
            log,
            logging.INFO,
            "unprocessable",
            request_id=request_id,
            key=key,
            error_class=error_class.value,
            reason=reason[:200],
        )

    async def _send(
        self,
        outcome: DeadLetter,
        envelope: Envelope,
        key: str | None = None,
        partition: int | None = None,
        **extra: str,
    ) -> int:
        """The dead letter on `dlq`, confirmed; returns when it was written (epoch ms)."""
        at = self.clock()
        envelope.error_class = outcome.error_class.value
        envelope.last_error = envelope.last_error or outcome.reason
        # In the DLQ, retry_count is the number of retries made: attempts - 1.
        headers = envelope.headers(
            final_error=outcome.reason, dead_at=at, retry_count=max(envelope.attempts - 1, 0), **extra
        )
        try:
            await self.store.send(self.dlq, key or envelope.request_id, envelope.payload, headers, partition=partition)
        except RecordTooLarge:
            # Only a record larger than `input` accepts gets here (a foreign one on a tier or
            # commands topic): its dead letter keeps a preview, never a restart loop.
            size = len(envelope.payload)
            headers = envelope.headers(
                final_error=outcome.reason,
                dead_at=at,
                retry_count=max(envelope.attempts - 1, 0),
                **{H_PAYLOAD_TRUNCATED: "true", H_PAYLOAD_BYTES: str(size)},
            )
            preview = envelope.payload[:PREVIEW_BYTES]
            await self.store.send(self.dlq, key or envelope.request_id, preview, headers, partition=partition)
        return at
