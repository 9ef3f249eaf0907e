"""Operator actions on dead letters: replay (optionally edited) and discard, with a ledger.

Every action runs on the worker that owns the request, inside the commands agent's
stream: actions on one request are serialised (replaying an id twice, even at once,
yields one replay), and they may write tables. Web views and the CLI reach them with
`Agent.ask()`, which carries the answer back to whichever worker asked.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from typing import Any

from faust import TopicT
from faust.tables import Table

from dlqapp import metrics
from dlqapp import state as states
from dlqapp.dlq import DeadLetterRecorder, find_dead_letter, original_payload, owner_id
from dlqapp.partitioning import owner_partition
from dlqapp.logs import log_event
from dlqapp.models import H_ORIGINAL_TIMESTAMP, H_REPLAY_COUNT, H_REPLAY_OF, InvalidRequest, now_ms, validate_request
from dlqapp.pipeline import Pipeline
from dlqapp.retention import ledger_last_change, request_last_change, still_unchanged
from dlqapp.topology import UNDECODABLE

log = logging.getLogger("dlqapp.operator")

H_REPLAYED_BY = "replayed_by"
H_REPLAYED_AT = "replayed_at"
H_FIRST_SEEN = "first_seen"

REPLAY, DISCARD, EXPIRE = "replay", "discard", "expire"


@dataclass(frozen=True)
class Command:
    """What an operator asked for. `payload` is an edited request (replay only)."""

    action: str
    request_id: str
    actor: str
    payload: dict[str, Any] | None = None
    force: bool = False
    """Replay even though the request has succeeded since it was dead-lettered."""
    table: str | None = None
    expired: list[list[Any]] | None = None
    """Expire only: [key, last change] pairs of `table` (dlqapp.retention)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any) -> "Command":
        """A command from the commands topic; ValueError when it is not one."""
        if not isinstance(raw, dict):
            raise ValueError(f"a command must be a JSON object, not {type(raw).__name__}")
        if UNDECODABLE in raw:
            raise ValueError(str(raw[UNDECODABLE]))
        try:
            command = cls(**raw)
        except TypeError as exc:
            raise ValueError(f"not a command: {exc}") from None
        if not (isinstance(command.action, str) and isinstance(command.request_id, str) and command.request_id and isinstance(command.actor, str)):
            raise ValueError("a command needs string action, request_id and actor")
        if command.payload is not None and not isinstance(command.payload, dict):
            raise ValueError("payload must be an object")
        return command


def check_edit(request_id: str, payload: Any) -> list[str]:
    """Reasons an edited payload cannot be replayed (empty when it can)."""
    if not isinstance(payload, dict):
        return ["payload must be a JSON object"]
    try:
        validate_request(payload)
    except InvalidRequest as exc:
        return exc.reasons
    if payload["request_id"] != request_id:
        return [f"payload.request_id must stay {request_id!r}"]
    return []


class Operator:
    """Carries out commands on the owning worker."""

    def __init__(self, pipeline: Pipeline, recorder: DeadLetterRecorder, ledger: Table, input_topic: TopicT, dlq_topic: TopicT) -> None:
        self.pipeline = pipeline
        self.recorder = recorder
        self.dead_letters = recorder.table
        self.ledger = ledger
        self.input_topic = input_topic
        self.dlq_topic = dlq_topic
        self.max_replays = pipeline.settings.max_replays

    def ledger_for(self, request_id: str) -> list[dict[str, Any]]:
        blob = self.ledger.get(request_id.encode())
        return json.loads(blob) if blob else []

    async def execute(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Run one command; answer with its status (`reprocessed`, `discarded`, `not_found`, …)."""
        command = Command.from_dict(raw)
        if command.action == EXPIRE:
            return self._expire(command)
        key = find_dead_letter(self.dead_letters, command.request_id, self.pipeline.settings.partitions)
        if key is None:
            return {"request_id": command.request_id, "status": "not_found"}
        entry = json.loads(self.dead_letters[key])
        command = replace(command, request_id=key.decode())
        if command.action == DISCARD:
            return await self._discard(command, entry)
        if command.action == REPLAY:
            return await self._replay(command, entry)
        return {"request_id": command.request_id, "status": "invalid", "reason": f"unknown action {command.action!r}"}

    async def _replay(self, command: Command, entry: dict[str, Any]) -> dict[str, Any]:
        key = command.request_id
        rid = owner_id(key)
        ledger = self.ledger_for(rid)
        replays = sum(1 for record in ledger if record["action"] == REPLAY)
        if replays >= self.max_replays:
            reason = f"{rid} was replayed {replays} times already (DLQ_MAX_REPLAYS={self.max_replays})"
            return {"request_id": key, "status": "refused", "reason": reason}
        current = self.pipeline.load_state(rid)
        if not command.force and current is not None and current.get("state") == states.SUCCEEDED:
            reason = f"{rid} has succeeded since it was dead-lettered (at {current.get('updated_at')}); replaying would call the model again: send force=true to replay anyway"
            return {"request_id": key, "status": "refused", "reason": reason, "state": states.SUCCEEDED}
        if command.payload is not None:
            problems = check_edit(rid, command.payload)
            if problems:
                return {"request_id": key, "status": "invalid", "reasons": problems}
            payload = json.dumps(command.payload).encode()
        elif entry.get("payload_truncated"):
            reason = f"the payload ({entry['payload_bytes']} bytes) is over DLQ_MAX_PAYLOAD_BYTES: replay it with an edited payload"
            return {"request_id": key, "status": "invalid", "reasons": [reason]}
        else:
            payload = original_payload(entry)
        at = now_ms()
        dlq_position = f"{entry['dlq']['partition']}:{entry['dlq']['offset']}"
        headers = {
            H_REPLAY_OF: dlq_position,
            H_REPLAY_COUNT: str(replays + 1),
            H_REPLAYED_BY: command.actor,
            H_REPLAYED_AT: str(at),
            H_ORIGINAL_TIMESTAMP: str(at),  # a fresh TTL clock, a clean retry count
            H_FIRST_SEEN: str(entry.get("first_seen") or ""),
        }
        # State first: the input agent may handle the replay the moment it is sent, and
        # its outcome (a quick success, a new retry) must not be overwritten by this.
        record = {"action": REPLAY, "at": at, "by": command.actor, "edited": command.payload is not None, "replay_of": dlq_position, "error_class": entry.get("error_class"), "replay_count": replays + 1, "forced": command.force}
        self._append_ledger(rid, ledger, record)
        self.pipeline.set_state(rid, states.REPROCESSED, at, replay_count=replays + 1, replayed_by=command.actor)
        await self.pipeline.send(self.input_topic, rid, payload, [(k, v.encode()) for k, v in headers.items()])
        await self._remove(key)
        self.pipeline.counters.add("reprocessed")
        metrics.replays.inc()
        log_event(log, logging.INFO, "replayed", request_id=rid, by=command.actor, replay_count=replays + 1, edited=command.payload is not None)
        return {"request_id": key, "status": "reprocessed", "replay_count": replays + 1}

    async def _discard(self, command: Command, entry: dict[str, Any]) -> dict[str, Any]:
        key = command.request_id
        rid = owner_id(key)
        at = now_ms()
        await self._remove(key)
        self._append_ledger(rid, self.ledger_for(rid), {"action": DISCARD, "at": at, "by": command.actor, "error_class": entry.get("error_class"), "key": key})
        state = self.pipeline.load_state(rid)
        if key == rid or state is None or state.get("dlq_key") == key:  # discarding an invalid copy leaves the request's state alone
            self.pipeline.set_state(rid, states.DISCARDED, at, discarded_by=command.actor)
        metrics.discards.inc()
        log_event(log, logging.INFO, "discarded", request_id=rid, key=key, by=command.actor)
        return {"request_id": key, "status": "discarded"}

    def _expire(self, command: Command) -> dict[str, Any]:
        """Delete settled records the sweeper found old, unless they changed since."""
        tables = {self.pipeline.requests.name: (self.pipeline.requests, request_last_change), self.ledger.name: (self.ledger, ledger_last_change)}
        if command.table not in tables or not isinstance(command.expired, list):
            raise ValueError("expire needs a known table and a list of [key, last change] pairs")
        table, last_change = tables[command.table]
        removed = 0
        for pair in command.expired:
            key, at = pair
            blob = table.get(str(key).encode())
            if still_unchanged(blob, at, last_change):
                del table[str(key).encode()]
                removed += 1
        log_event(log, logging.DEBUG, "expired", table=command.table, removed=removed, asked=len(command.expired))
        return {"request_id": command.request_id, "status": "expired", "removed": removed}

    async def _remove(self, key: str) -> None:
        """Tombstone the compacted `dlq` topic, then drop the table entry."""
        partition = owner_partition(owner_id(key), self.pipeline.settings.partitions)
        await self.pipeline.send(self.dlq_topic, key, None, [], partition=partition)
        self.recorder.remove(key.encode())

    def _append_ledger(self, request_id: str, ledger: list[dict[str, Any]], record: dict[str, Any]) -> None:
        self.ledger[request_id.encode()] = json.dumps([*ledger, record][-100:]).encode()
