"""Faust's events become `Record`s: the door every consumed message goes through."""

from __future__ import annotations

from typing import Any

from faust import EventT

from dlqapp.core.clock import Clock
from dlqapp.core.headers import header_dict
from dlqapp.core.record import Record


def record_of(event: EventT | TailEvent, clock: Clock) -> Record:
    """The one `Record` of `event` (its headers parsed here, its bytes as they came)."""
    message = event.message
    timestamp = message.timestamp
    return Record.read(
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        timestamp_ms=int(timestamp * 1000) if timestamp else clock(),
        key=_bytes_or_none(message.key),
        payload=_bytes_or_none(message.value),
        headers=header_dict(message.headers),
    )


def _bytes_or_none(value: object) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    return None


class TailMessage:
    """An aiokafka `ConsumerRecord` read by the tail read (dlqapp.kafka.tail_read), shaped as
    Faust's message is where dlqapp reads one (`record_of`)."""

    __slots__ = ("headers", "key", "offset", "partition", "timestamp", "topic", "value")

    def __init__(self, record: Any) -> None:
        self.topic: str = record.topic
        self.partition: int = record.partition
        self.offset: int = record.offset
        self.timestamp = record.timestamp / 1000 if record.timestamp is not None else None
        self.key = record.key
        self.value = record.value
        self.headers = list(record.headers or ())


class TailEvent:
    """A record read ahead of its turn: the event of an ahead ticket (dlqapp.kafka.acks),
    never acked itself (the consumer's own event at its offset is)."""

    __slots__ = ("message",)

    def __init__(self, record: Any) -> None:
        self.message = TailMessage(record)
