"""What can go wrong with a partition's transaction, each error named for what happens to
the event (dlqapp.core.errors): stop the worker, hand the event back, or poison."""

from __future__ import annotations

from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    RecordListTooLargeError,
    RecordTooLargeError,
    UnsupportedForMessageFormatError,
)

from dlqapp.core.errors import HandBack, Poison, StopWorker

Position = tuple[str, int, int]
"""(topic, partition, offset) of a consumed record."""

RECORD_ERRORS = (
    RecordTooLargeError,
    RecordListTooLargeError,
    CorruptRecordException,
    InvalidTimestampError,
    UnsupportedForMessageFormatError,
)
"""What a broker answers about one record (not the transaction, not the connection)."""


class TransactionFailed(StopWorker):
    """A partition's transaction could not be committed: the worker must stop (its tables
    hold writes that never became visible). `culprits`: the records whose steps made it
    fail, when known (a step that failed after its first output, a record the broker
    refused); a broker away or a fenced producer names none."""

    def __init__(self, message: str, culprits: tuple[Position, ...] = ()) -> None:
        super().__init__(message)
        self.culprits = culprits


class NotOwned(HandBack):
    """An output for a partition this worker no longer owns (its transaction was closed by a
    rebalance): the step's event goes back, unacked, to the partition's next owner."""


class RecordTooLarge(Poison):
    """The producer refused one record as larger than its request size (nothing was added
    to the transaction, which stays good)."""
