"""Error classes and whether each is worth retrying: retry decisions as data.

Backends raise `InferenceError` with a class; anything else they raise is classified
by `classify_exception`. The router only looks classes up in the retryable table.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import StrEnum


class ErrorClass(StrEnum):
    """Why an attempt failed. The value is what headers, the DLQ and the API show."""

    TIMEOUT = "timeout"
    CONNECTION_ERROR = "connection_error"
    SERVER_ERROR = "server_error"
    RATE_LIMITED = "rate_limited"
    QUOTA_EXCEEDED = "quota_exceeded"
    INVALID_REQUEST = "invalid_request"
    AUTH_ERROR = "auth_error"
    CONTEXT_LENGTH = "context_length"
    CONTENT_FILTER = "content_filter"
    EXPIRED = "expired"
    REPLAY_LIMIT = "replay_limit"
    POISON = "poison"
    UNKNOWN = "unknown"


DEFAULT_RETRYABLE: dict[ErrorClass, bool] = {
    ErrorClass.TIMEOUT: True,
    ErrorClass.CONNECTION_ERROR: True,
    ErrorClass.SERVER_ERROR: True,
    ErrorClass.RATE_LIMITED: True,
    ErrorClass.UNKNOWN: True,
    ErrorClass.QUOTA_EXCEEDED: False,
    ErrorClass.INVALID_REQUEST: False,
    ErrorClass.AUTH_ERROR: False,
    ErrorClass.CONTEXT_LENGTH: False,
    ErrorClass.CONTENT_FILTER: False,
    ErrorClass.EXPIRED: False,
    ErrorClass.REPLAY_LIMIT: False,
    ErrorClass.POISON: False,
}
"""Retryable by default: transient failures and the unexplained. Overridden by DLQ_RETRYABLE."""


@dataclass(frozen=True)
class Failure:
    """One failed attempt, as the router sees it."""

    error_class: ErrorClass
    message: str
    retry_after_ms: int | None = None
    retryable: bool | None = None
    """Set when the provider said (x-should-retry); overrides the retryable table."""


class InferenceError(Exception):
    """Raised by a backend for a failure it has already classified."""

    def __init__(
        self, error_class: ErrorClass, message: str, retry_after_ms: int | None = None, retryable: bool | None = None
    ):
        super().__init__(message)
        self.failure = Failure(error_class, message, retry_after_ms, retryable)

    @classmethod
    def of(cls, failure: Failure) -> InferenceError:
        return cls(failure.error_class, failure.message, failure.retry_after_ms, failure.retryable)


def classify_exception(exc: BaseException) -> Failure:
    """Map any exception from a backend call to a `Failure`; unexpected ones are `unknown`."""
    if isinstance(exc, InferenceError):
        return exc.failure
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return Failure(ErrorClass.TIMEOUT, f"backend call timed out ({type(exc).__name__})")
    if isinstance(exc, (ConnectionError, OSError)):
        return Failure(ErrorClass.CONNECTION_ERROR, f"{type(exc).__name__}: {exc}")
    return Failure(ErrorClass.UNKNOWN, f"{type(exc).__name__}: {exc}")


def is_retryable(failure: Failure, table: dict[ErrorClass, bool]) -> bool:
    """The provider's word when it gave one, else the table (missing classes are retried)."""
    if failure.retryable is not None:
        return failure.retryable
    return table.get(failure.error_class, True)


class DlqError(Exception):
    """dlqapp's own failures of a stream step, each named for what happens to its event::

        DlqError
         ├─ HandBack     the event is not ours any more (its partition was handed back):
         │               give it back unacked, quietly; the next owner handles it
         ├─ StopWorker   the worker cannot go on safely (its transaction failed, the broker
         │               refused a send): stop it without acking; under exactly_once it
         │               restarts in place and rebuilds its tables
         └─ Poison       this record breaks its handler: dead-letter it as `poison`

    Any other exception a handler raises is a bug on one record and is treated as `Poison`.
    """


class HandBack(DlqError):
    """The event's partition was handed back: give the event back unacked, without a word."""


class StopWorker(DlqError):
    """Stop the worker, leaving the event unacked (it is handled again after the restart)."""


class Poison(DlqError):
    """This record cannot be handled: dead-letter it as `poison` with this reason."""
