"""Each request's state machine and bounded history, as stored in the `requests` table.

received → in_flight → retry_scheduled(k) → … → succeeded | dead_lettered → reprocessed …
`in_flight` is live only in the worker's memory (a crash must not leave a request stuck
in it); the table records every settled state.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from dlqapp.core import compact_json
from dlqapp.core.envelope import HISTORY_LIMIT


class RequestState(StrEnum):
    """Where a request stands (stored as its string value)."""

    IN_FLIGHT = "in_flight"
    RETRY_SCHEDULED = "retry_scheduled"
    SUCCEEDED = "succeeded"
    DEAD_LETTERED = "dead_lettered"
    REPROCESSED = "reprocessed"
    DISCARDED = "discarded"
    BUDGET_HELD = "budget_held"
    """Over its tenant's (or model's) budget: parked until the window rolls or the budget is
    raised; no attempt spent on it (dlqapp.processing.spend)."""


SUCCEEDED = RequestState.SUCCEEDED
RETRY_SCHEDULED = RequestState.RETRY_SCHEDULED
DEAD_LETTERED = RequestState.DEAD_LETTERED
REPROCESSED = RequestState.REPROCESSED
DISCARDED = RequestState.DISCARDED
IN_FLIGHT = RequestState.IN_FLIGHT
BUDGET_HELD = RequestState.BUDGET_HELD

SETTLED_FOR_DEDUP = frozenset({SUCCEEDED, RETRY_SCHEDULED, BUDGET_HELD})
"""A new copy of a request in one of these states is a duplicate: skip it."""


NOT_IN_HISTORY = frozenset({"history", "attempt_log"})
"""Details kept on the record only: `attempt_log` (a success's attempt history, for the
request lookup) would repeat itself in every history entry."""

_CORE_FIELDS = ("request_id", "first_seen", "duplicates", "history", "state", "updated_at", "succeeded_once")


@dataclass(slots=True)
class StoredState:
    """A request's stored state: where it stands, since when, and its bounded history.

    `details` holds what the last changes said (`attempts`, `tier`, `due`, `error_class`,
    `last_error`, `final_error`, `model`, `attempt_log`, `dlq_key`, `replay_count`, …);
    encoded, they sit beside the other fields in one JSON object (the `/requests/{id}/` shape).
    """

    request_id: str
    state: str
    first_seen: int
    updated_at: int
    duplicates: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    succeeded_once: bool = False
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def attempts(self) -> int:
        value = self.details.get("attempts")
        return value if isinstance(value, int) else 0

    @property
    def due(self) -> int | None:
        """The due time of its parked retry, when it is `retry_scheduled`."""
        value = self.details.get("due")
        return value if isinstance(value, int) else None

    @property
    def replay_count(self) -> int:
        value = self.details.get("replay_count")
        return value if isinstance(value, int) else 0

    def get(self, name: str) -> Any:
        """A detail the last changes recorded (None when absent)."""
        return self.details.get(name)

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "request_id": self.request_id,
            "first_seen": self.first_seen,
            "duplicates": self.duplicates,
            "history": self.history,
        }
        doc["state"] = self.state
        doc["updated_at"] = self.updated_at
        doc.update(self.details)
        if self.succeeded_once:
            doc["succeeded_once"] = True
        return doc

    def encode(self) -> bytes:
        return compact_json.dumps(self.as_dict())

    @classmethod
    def decode(cls, blob: bytes | None) -> StoredState | None:
        """The record stored in `blob` (None for no blob); ValueError when it holds none."""
        if not blob:
            return None
        doc = compact_json.loads(blob)
        if not isinstance(doc, dict):
            raise ValueError("a request state is a JSON object")
        return cls(
            request_id=doc.get("request_id", ""),
            state=doc.get("state", ""),
            first_seen=doc.get("first_seen", 0),
            updated_at=doc.get("updated_at", 0),
            duplicates=doc.get("duplicates", 0),
            history=doc.get("history") or [],
            succeeded_once=bool(doc.get("succeeded_once")),
            details={k: v for k, v in doc.items() if k not in _CORE_FIELDS},
        )


def transition(
    previous: StoredState | None, request_id: str, state: RequestState, at: int, **detail: Any
) -> StoredState:
    """The next stored state: `previous` moved to `state`, with the change appended to history."""
    if previous is None:
        current = StoredState(request_id, state, first_seen=at, updated_at=at)
    else:
        current = replace(previous, state=state, updated_at=at, details=dict(previous.details))
    current.details.update({k: v for k, v in detail.items() if k != "history"})
    noted = {k: v for k, v in detail.items() if k not in NOT_IN_HISTORY}
    current.history = [*current.history, {"at": at, "state": state, **noted}][-HISTORY_LIMIT:]
    if state == SUCCEEDED:
        current.succeeded_once = True
    return current


def count_duplicate(previous: StoredState, at: int, source: str) -> StoredState:
    """`previous` with one more duplicate counted, its state unchanged."""
    history = [*previous.history, {"at": at, "state": "duplicate_skipped", "source": source}][-HISTORY_LIMIT:]
    return replace(previous, duplicates=previous.duplicates + 1, history=history)


def counted(previous: StoredState | None, new: StoredState) -> list[str]:
    """The counters (dlqapp.tables.counters) a state change moves: `received` for a new id (not
    for an operator's replay),
    `succeeded` the first time it succeeds, one per retry tier and per dead letter."""
    # a replay is not a request received: its request was counted when it first came (its
    # state may have been swept since, or it never had one: a record without a request id)
    names = [] if previous is not None or new.state == REPROCESSED else ["received"]
    if new.state == SUCCEEDED and not (previous is not None and previous.succeeded_once):
        names.append("succeeded")
    elif new.state == RETRY_SCHEDULED:
        names.append(f"retried|{new.get('tier') or '?'}")
    elif new.state == DEAD_LETTERED:
        names.append(f"dead_lettered|{new.get('error_class') or 'unknown'}")
    if new.state == BUDGET_HELD and not (previous is not None and previous.state == BUDGET_HELD):
        names.append("budget_holds")
    return names


def held_move(previous: StoredState | None, new: StoredState) -> int:
    """+1 when the change holds a request over its budget, -1 when it releases one, else 0
    (the `budget_held_now` counter: requests held now)."""
    was = previous is not None and previous.state == BUDGET_HELD
    return int(new.state == BUDGET_HELD) - int(was)
