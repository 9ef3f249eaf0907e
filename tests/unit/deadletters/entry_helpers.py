"""What the tests of dlqapp.deadletters.entries share: a full set of `dlq` headers, the
position hash of an unprocessable key, and an entry built, stored and read back as
dlqapp does."""

from __future__ import annotations

import hashlib
import json

from dlqapp.deadletters.entries import DeadLetterEntry

T0 = 1_700_000_000_000
HISTORY = [
    {"attempt": 1, "at": T0, "topic": "app.input", "error_class": "server_error", "error": "503"},
    {"attempt": 2, "at": T0 + 1000, "topic": "app.retry-1s", "error_class": "auth_error", "error": "401"},
]
FULL_HEADERS = {
    "request_id": "r-1",
    "error_class": "auth_error",
    "final_error": "401 Unauthorized",
    "last_error": "401",
    "retry_count": "1",
    "attempts": "2",
    "attempt_history": json.dumps(HISTORY),
    "original_timestamp": str(T0 - 500),
    "dead_at": str(T0 + 1001),
    "source": json.dumps({"topic": "app.input", "partition": 2, "offset": 17}),
    "replay_count": "3",
}


def position(topic: str, partition: int, offset: int) -> str:
    """What dlqapp.processing.pipeline puts after the class in an unprocessable key."""
    return hashlib.sha256(f"{topic}:{partition}:{offset}".encode()).hexdigest()[:12]


def stored(entry: dict) -> dict:
    """An entry as the recorder writes it to the `dead-letters` table and the API reads it back."""
    return json.loads(json.dumps(entry, separators=(",", ":")).encode())


def build_entry(
    key: str, payload: bytes, headers: dict, partition: int, offset: int, max_bytes: int | None = None
) -> dict:
    """The stored JSON of the entry a `dlq` message makes (`DeadLetterEntry.from_message`, encoded)."""
    return json.loads(
        DeadLetterEntry.from_message(
            key, payload, headers, partition=partition, offset=offset, max_bytes=max_bytes
        ).encode()
    )


def typed(entry: dict) -> DeadLetterEntry:
    """A stored entry decoded as the recorder, operator and API read it."""
    return DeadLetterEntry.decode(json.dumps(entry).encode())


def original_payload(entry: dict) -> bytes:
    return typed(entry).original_payload()


def presented(entry: dict) -> dict:
    return typed(entry).presented()


def summary(entry: dict) -> dict:
    return typed(entry).summary()
