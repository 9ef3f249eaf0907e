"""Each request's state machine and bounded history, as stored in the `requests` table.

received → in_flight → retry_scheduled(k) → … → succeeded | dead_lettered → reprocessed …
`in_flight` is live only in the worker's memory (a crash must not leave a request stuck
in it); the table records every settled state.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from dlqapp.core.envelope import HISTORY_LIMIT


class RequestState(StrEnum):
    """Where a request stands (stored as its string value)."""

    IN_FLIGHT = "in_flight"
    RETRY_SCHEDULED = "retry_scheduled"
    SUCCEEDED = "succeeded"
    DEAD_LETTERED = "dead_lettered"
    REPROCESSED = "reprocessed"
    DISCARDED = "discarded"


SUCCEEDED = RequestState.SUCCEEDED
RETRY_SCHEDULED = RequestState.RETRY_SCHEDULED
DEAD_LETTERED = RequestState.DEAD_LETTERED
REPROCESSED = RequestState.REPROCESSED
DISCARDED = RequestState.DISCARDED
IN_FLIGHT = RequestState.IN_FLIGHT

SETTLED_FOR_DEDUP = frozenset({SUCCEEDED, RETRY_SCHEDULED})
"""A new copy of a request in one of these states is a duplicate: skip it."""


NOT_IN_HISTORY = frozenset({"history", "attempt_log"})
"""Details kept on the record only: `attempt_log` (a success's attempt history, for the
request lookup) would repeat itself in every history entry."""


def load(blob: bytes | None) -> dict[str, Any] | None:
    return json.loads(blob) if blob else None


def dump(state: dict[str, Any]) -> bytes:
    return json.dumps(state, separators=(",", ":")).encode()


def transition(previous: dict[str, Any] | None, request_id: str, state: RequestState, at: int, **detail: Any) -> dict[str, Any]:
    """The next stored state: `previous` moved to `state`, with the change appended to history."""
    current = dict(previous) if previous else {"request_id": request_id, "first_seen": at, "duplicates": 0, "history": []}
    current["state"] = state
    current["updated_at"] = at
    current.update({k: v for k, v in detail.items() if k != "history"})
    noted = {k: v for k, v in detail.items() if k not in NOT_IN_HISTORY}
    current["history"] = [*current.get("history", []), {"at": at, "state": state, **noted}][-HISTORY_LIMIT:]
    if state == SUCCEEDED:
        current["succeeded_once"] = True
    return current


def count_duplicate(previous: dict[str, Any], at: int, source: str) -> dict[str, Any]:
    """`previous` with one more duplicate counted, its state unchanged."""
    current = dict(previous)
    current["duplicates"] = current.get("duplicates", 0) + 1
    current["history"] = [*current.get("history", []), {"at": at, "state": "duplicate_skipped", "source": source}][-HISTORY_LIMIT:]
    return current


def counted(previous: dict[str, Any] | None, new: dict[str, Any]) -> list[str]:
    """The counters (dlqapp.tables.counters) a state change moves: `received` for a new id,
    `succeeded` the first time it succeeds, one per retry tier and per dead letter."""
    names = [] if previous is not None else ["received"]
    state = new["state"]
    if state == SUCCEEDED and not (previous or {}).get("succeeded_once"):
        names.append("succeeded")
    elif state == RETRY_SCHEDULED:
        names.append(f"retried|{new.get('tier', '?')}")
    elif state == DEAD_LETTERED:
        names.append(f"dead_lettered|{new.get('error_class', 'unknown')}")
    return names
