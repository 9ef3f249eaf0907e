"""Dedup: which messages must not start an attempt chain of their own.

The request's state in the `requests` table (dlqapp.tables.request_store) and the attempts
running here decide; docs/how-it-works.md, Dedup, tells the rules.
"""

from __future__ import annotations

import logging

from dlqapp.core import states
from dlqapp.core.clock import Clock
from dlqapp.core.headers import H_REPLAY_COUNT, header_int
from dlqapp.core.in_flight import InFlight
from dlqapp.core.record import Record
from dlqapp.core.requests import salvage_request_id
from dlqapp.observability import metrics
from dlqapp.observability.logs import log_event
from dlqapp.tables.request_store import RequestStore

log = logging.getLogger("dlqapp.processing.pipeline")


class Dedup:
    """Tells a duplicate (and counts it), or a message whose request already succeeded."""

    def __init__(self, store: RequestStore, in_flight: InFlight, clock: Clock, *, redelivery_by_time: bool) -> None:
        """`redelivery_by_time`: take a message written before its request was first seen for
        a redelivery (at_least_once; under exactly_once the partition's progress does it)."""
        self.store = store
        self.in_flight = in_flight
        self.clock = clock
        self.redelivery_by_time = redelivery_by_time

    def is_duplicate(self, request_id: str, record: Record) -> bool:
        """True (and counted) when this message must not start an attempt chain of its own
        (docs/how-it-works.md, Dedup):

        - an attempt of the request is running here, or its retry is parked, or it succeeded;
        - an operator's replay of it is on its way and this message is not that replay;
        - under at_least_once only, the message was written before the request was first
          seen (the same message again, redelivered after a crash). Under exactly_once a
          redelivered message never gets here: its outputs committed with the partition's
          progress, and the door skips it (dlqapp.tables.progress), whatever the clocks say.

        A request the table says is in flight, but that no attempt here is running, is not a
        duplicate: its attempt died with its worker or its partition, and nothing else would
        end it. Nor is a request dead-lettered or discarded: a new copy is a new chain."""
        previous = self.store.load_state(request_id)
        if request_id in self.in_flight:
            if previous is None:  # first seen moments ago: count it now, its outcome will find this record
                previous = states.transition(None, request_id, states.IN_FLIGHT, self.clock())
                self.store.counters.add("received")
        elif previous is None or previous.state == states.IN_FLIGHT:
            return False
        elif previous.state == states.REPROCESSED:
            if (header_int(record.headers, H_REPLAY_COUNT) or 0) == previous.replay_count:
                return False  # the replay itself
        elif previous.state not in states.SETTLED_FOR_DEDUP and not (
            self.redelivery_by_time and record.written_ms <= previous.first_seen
        ):
            return False
        self.store.store_state(request_id, states.count_duplicate(previous, self.clock(), record.topic))
        self.store.counters.add("duplicates_skipped")
        metrics.duplicates.inc()
        metrics.requests.labels("duplicate_skipped").inc()
        log_event(
            log, logging.INFO, "duplicate_skipped", request_id=request_id, topic=record.topic, state=previous.state
        )
        return True

    def already_succeeded(self, record: Record) -> bool:
        """The request this message carries (by the id in its payload) has a result already."""
        request_id = salvage_request_id(record.payload)
        if not request_id or self.store.owner(request_id) != record.partition:
            return False
        state = self.store.load_state(request_id)
        return state is not None and state.state == states.SUCCEEDED
