"""What every stream step does with Kafka and the tables, for the request it handles.

dlqapp sends every message about a request to the partition that owns its id, and keeps
the request's state on that partition, so dedup, state, parked retries and dead letters
of one request live on one worker. The pipeline, the retry scheduler and the operator all
go through this one component.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from faust import TopicT
from faust.types import TableT

from dlqapp.core import compact_json, states
from dlqapp.core.clock import Clock
from dlqapp.core.headers import H_ORIGINAL_TIMESTAMP, H_SOURCE
from dlqapp.core.partitioning import owner_partition
from dlqapp.core.record import Record
from dlqapp.core.states import RequestState, StoredState
from dlqapp.observability.logs import log_event
from dlqapp.tables.counters import Counters

log = logging.getLogger("dlqapp.tables.request_store")

RECORD_FRAMING_BYTES = 128
"""A record batch's framing around one record (header, CRC, lengths, timestamps), with room."""
HEADER_FRAMING_BYTES = 10

Send = Callable[[str, bytes, bytes | None, int, list[tuple[str, bytes]]], Awaitable[Awaitable[Any]]]
"""`send(topic, key, value, partition, headers)`: hands one record to the producer and
returns what resolves once the broker has it (dlqapp.kafka.faust_producer.producer_send)."""


class RequestStore:
    """Sends confirmed by the broker, ownership, and request state on the owning partition."""

    def __init__(self, partitions: int, requests: TableT, *, counters: Counters, clock: Clock, send: Send) -> None:
        self.partitions = partitions
        self._send = send
        self.requests = requests
        self.counters = counters
        self.clock = clock

    def owner(self, request_id: str) -> int:
        """The partition that owns `request_id` on every topic and table."""
        return owner_partition(request_id, self.partitions)

    def owns(self, record: Record, request_id: str) -> bool:
        """Whether `record` sits on the partition that owns `request_id`."""
        return record.partition == self.owner(request_id)

    async def send(
        self,
        topic: TopicT,
        key: str,
        value: bytes | None,
        headers: list[tuple[str, bytes]],
        partition: int | None = None,
    ) -> None:
        """Send to `key`'s owner partition (or `partition`) and wait until the broker confirms.

        A None value is a tombstone (used on the compacted `dlq` topic)."""
        pending = await self._send(
            topic.get_topic_name(), key.encode(), value, self.owner(key) if partition is None else partition, headers
        )
        await pending

    def forward_headers(self, record: Record) -> dict[str, str]:
        """The headers a message re-sent to its owning partition carries: its own, and where
        and when it was first written."""
        headers = dict(record.headers)
        headers.setdefault(H_ORIGINAL_TIMESTAMP, str(record.timestamp_ms))
        headers.setdefault(H_SOURCE, compact_json.dumps_str(record.source))
        return headers

    def fits_forward(self, record: Record, request_id: str, limit: int) -> bool:
        """Whether the message, re-sent keyed by `request_id` with its forward headers, stays
        within `limit` bytes (the input topic's max.message.bytes), batch framing included."""
        headers = self.forward_headers(record)
        size = len(record.payload or b"") + len(request_id.encode()) + RECORD_FRAMING_BYTES
        size += sum(len(k.encode()) + len(v.encode()) + HEADER_FRAMING_BYTES for k, v in headers.items())
        return size <= limit

    async def forward(self, record: Record, topic: TopicT, request_id: str) -> None:
        """Re-send a message keyed by its request id to the partition that owns it.

        Producers need not key by request id: this hop makes dedup and state local.
        """
        headers = self.forward_headers(record)
        await self.send(topic, request_id, record.payload or b"", as_header_pairs(headers))
        log_event(log, logging.DEBUG, "rerouted", request_id=request_id, topic=record.topic)

    def load_state(self, request_id: str) -> StoredState | None:
        return StoredState.decode(self.requests.get(request_id.encode()))

    def store_state(self, request_id: str, record: StoredState) -> None:
        """Write a state record as it is (inside the owning partition's stream)."""
        self.requests[request_id.encode()] = record.encode()

    def set_state(self, request_id: str, state: RequestState, at: int, **detail: Any) -> None:
        """Move a request to `state` (inside the owning partition's stream), and count it."""
        previous = self.load_state(request_id)
        new = states.transition(previous, request_id, state, at, **detail)
        self.store_state(request_id, new)
        for name in states.counted(previous, new):
            self.counters.add(name)
        held = states.held_move(previous, new)
        if held:
            self.counters.add("budget_held_now", held)


def as_header_pairs(headers: Mapping[str, str]) -> list[tuple[str, bytes]]:
    """str → str headers as Kafka header pairs."""
    return [(k, v.encode()) for k, v in headers.items()]
