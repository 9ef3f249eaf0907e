"""Faust's events become `Record`s: the door every consumed message goes through."""

from __future__ import annotations

from faust import EventT

from dlqapp.core.clock import Clock
from dlqapp.core.headers import header_dict
from dlqapp.core.record import Record


def record_of(event: EventT, clock: Clock) -> Record:
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
