"""The operator's vocabulary: actions, the statuses they answer with, and the command itself.

Commands travel as JSON on the internal commands topic to the worker that owns the
request (dlqapp.deadletters.operator carries them out).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, Protocol

from dlqapp.core.requests import LONE_SURROGATE, InvalidRequest, lone_surrogate, validate_request

UNDECODABLE = "__dlqapp_undecodable__"
"""Key of what the commands topic's codec yields for bytes that are not JSON."""


class Action(StrEnum):
    """What an operator (or the retention sweep) asks a worker to do."""

    REPLAY = "replay"
    DISCARD = "discard"
    EXPIRE = "expire"
    RUN_NOW = "run_now"
    """A parked retry: hand it to the due agent now (dlqapp.retries.actions)."""
    DEAD_LETTER_NOW = "dead_letter_now"
    """A parked retry: send it to the DLQ now, with its history."""
    SET_BUDGET = "set_budget"
    """A budget (`request_id` is its key: a tenant, `*` or `model:<name>`; `payload` its limits),
    kept in the stats table on the key's partition (dlqapp.tables.spend_view)."""


class ReplayStatus(StrEnum):
    """How a command ended; the API maps each to an HTTP status."""

    REPROCESSED = "reprocessed"
    DISCARDED = "discarded"
    EXPIRED = "expired"
    FIRED = "fired"
    DEAD_LETTERED = "dead_lettered"
    NOT_FOUND = "not_found"
    REFUSED = "refused"
    SET = "set"
    INVALID = "invalid"
    ERROR = "error"


BULK_OUTCOMES = (
    ReplayStatus.REPROCESSED,
    ReplayStatus.NOT_FOUND,
    ReplayStatus.REFUSED,
    ReplayStatus.INVALID,
    ReplayStatus.ERROR,
)
"""The buckets of a bulk replay report, in order."""


@dataclass(frozen=True)
class Command:
    """What an operator asked for. `payload` is an edited request (replay only)."""

    action: Action
    request_id: str
    actor: str
    payload: dict[str, Any] | None = None
    force: bool = False
    """Replay even though the request has succeeded since it was dead-lettered."""
    table: str | None = None
    expired: list[list[Any]] | None = None
    """Expire only: [key, last change] pairs of `table` (dlqapp.tables.retention)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> Command:
        """A command from the commands topic; ValueError when it is not one."""
        if not isinstance(raw, dict):
            raise ValueError(f"a command must be a JSON object, not {type(raw).__name__}")
        if UNDECODABLE in raw:
            raise ValueError(str(raw[UNDECODABLE]))
        try:
            command = cls(**raw)
        except TypeError as exc:
            raise ValueError(f"not a command: {exc}") from None
        if not (isinstance(command.request_id, str) and command.request_id and isinstance(command.actor, str)):
            raise ValueError("a command needs string request_id and actor")
        try:
            action = Action(command.action)
        except ValueError:
            raise ValueError(f"unknown action {command.action!r} (known: {', '.join(Action)})") from None
        if command.payload is not None and not isinstance(command.payload, dict):
            raise ValueError("payload must be an object")
        return cls(**{**asdict(command), "action": action})


def check_edit(request_id: str, payload: Any) -> list[str]:
    """Reasons an edited payload cannot be replayed (empty when it can)."""
    if not isinstance(payload, dict):
        return ["payload must be a JSON object"]
    if lone_surrogate(payload):
        return [LONE_SURROGATE]
    try:
        validate_request(payload)
    except InvalidRequest as exc:
        return exc.reasons
    if payload["request_id"] != request_id:
        return [f"payload.request_id must stay {request_id!r}"]
    return []


RETRY_ACTIONS = frozenset({Action.RUN_NOW, Action.DEAD_LETTER_NOW})
"""Actions on a parked retry (`dlqapp.retries.actions`); the others act on dead letters."""

Answer = tuple[dict[str, Any], dict[str, Any] | None]
"""What a command handler gives back: the answer to the asker, and a ledger record or None."""


class CommandHandler(Protocol):
    """Carries out one command on the owning worker (`dlqapp.retries.actions.RetryActions`)."""

    async def execute(self, command: Command, at: int) -> Answer: ...
