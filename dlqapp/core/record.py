"""A consumed Kafka message, read once at the door.

Every agent turns the message it is handed into one `Record` before anything else looks
at it: the headers are parsed here (tolerantly, `dlqapp.core.headers`) and nowhere
downstream, and the payload's bytes are kept exactly as they came.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dlqapp.core.headers import H_ORIGINAL_TIMESTAMP, header_int


@dataclass(frozen=True, slots=True)
class Record:
    """One consumed message: where it was read, its key, payload and parsed headers."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    """Kafka's timestamp (the time it was read when the broker gave none)."""
    key: bytes | None
    payload: bytes | None
    headers: Mapping[str, str]
    written_ms: int
    """When the request's message was first written: its `original_timestamp` header (set
    when dlqapp re-sends it to the owning partition, or by a replay), else `timestamp_ms`."""

    @classmethod
    def read(
        cls,
        *,
        topic: str,
        partition: int,
        offset: int,
        timestamp_ms: int,
        key: bytes | None,
        payload: bytes | None,
        headers: Mapping[str, str],
    ) -> Record:
        """A record from a message's parts, `headers` already parsed to str → str."""
        written = header_int(headers, H_ORIGINAL_TIMESTAMP) or timestamp_ms
        return cls(topic, partition, offset, timestamp_ms, key, payload, headers, written)

    @property
    def source(self) -> dict[str, Any]:
        """Where the message was read: topic, partition, offset (the `source` header's shape)."""
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset}

    @property
    def position(self) -> tuple[str, int, int]:
        return (self.topic, self.partition, self.offset)

    @property
    def key_text(self) -> str | None:
        """The key as text (undecodable bytes replaced), None when there is none."""
        return self.key.decode("utf-8", "replace") if self.key else None
