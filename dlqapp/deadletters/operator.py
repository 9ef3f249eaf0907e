"""Operator actions on dead letters: replay (optionally edited) and discard, with a ledger;
and on parked retries (run now, dead-letter now: dlqapp.retries.actions).

Every action runs on the worker that owns the request, inside the commands agent's
stream: actions on one request are serialised (replaying an id twice, even at once,
yields one replay), and they may write tables. Web views and the CLI reach them with
`Agent.ask()`, which carries the answer back to whichever worker asked.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from faust import TopicT
from faust.types import TableT

from dlqapp.core import compact_json, states
from dlqapp.core.budgets import Budget, BudgetError, check_key
from dlqapp.core.clock import Clock
from dlqapp.core.commands import RETRY_ACTIONS, Action, Command, CommandHandler, ReplayStatus, check_edit
from dlqapp.core.headers import (
    H_FIRST_SEEN,
    H_ORIGINAL_TIMESTAMP,
    H_REPLAY_COUNT,
    H_REPLAY_OF,
    H_REPLAYED_AT,
    H_REPLAYED_BY,
    H_SPENT,
    H_TENANT,
)
from dlqapp.core.in_flight import InFlight
from dlqapp.core.prices import nusd_of
from dlqapp.deadletters.entries import DeadLetterEntry, find_dead_letter, owner_id
from dlqapp.deadletters.recorder import DeadLetterRecorder
from dlqapp.observability import metrics
from dlqapp.observability.logs import log_event
from dlqapp.observability.tracing import Tracing
from dlqapp.tables.request_store import RequestStore
from dlqapp.tables.retention import (
    ledger_last_change,
    request_last_change,
    still_unchanged,
)
from dlqapp.tables.spend_view import budget_record_key

log = logging.getLogger("dlqapp.deadletters.operator")


def live_chain(state: states.StoredState | None, running_here: bool) -> str | None:
    """How the request's live chain stands, when it has one (docs/operations.md, the replay
    rules): an attempt running, a retry parked, a replay not yet picked up, or a message
    whose attempt died with its worker and will run again. None when it has ended."""
    if running_here:
        return "being attempted right now"
    if state is None:
        return None
    if state.state == states.RETRY_SCHEDULED:
        return f"being retried (attempt {state.attempts} failed; its retry is parked in {state.get('tier')})"
    if state.state == states.REPROCESSED:
        return f"being replayed (replay {state.replay_count} is on its way)"
    if state.state == states.IN_FLIGHT:
        return "in flight (its message is handled again after its worker stopped)"
    if state.state == states.BUDGET_HELD:
        return f"held over its budget ({state.get('held_because')})"
    return None


def current_state(state: states.StoredState | None) -> str | None:
    return None if state is None else state.state


class Operator:
    """Carries out commands on the owning worker."""

    def __init__(
        self,
        store: RequestStore,
        recorder: DeadLetterRecorder,
        *,
        ledger: TableT,
        retries: CommandHandler,
        input_topic: TopicT,
        dlq_topic: TopicT,
        in_flight: InFlight,
        max_replays: int,
        clock: Clock,
        tracing: Tracing | None = None,
        budgets_table: TableT | None = None,
    ) -> None:
        """`tracing`: a span per replay, in the dead letter's trace (dlqapp.observability.tracing;
        default: off); `budgets_table`: where budgets set at run time are kept (the stats table,
        key `budget|<key>`, dlqapp.tables.spend_view)."""
        self.store = store
        self.recorder = recorder
        self.dead_letters = recorder.table
        self.ledger = ledger
        self.retries = retries
        self.input_topic = input_topic
        self.dlq_topic = dlq_topic
        self.in_flight = in_flight
        self.max_replays = max_replays
        self.clock = clock
        self.tracing = tracing or Tracing()
        self.budgets_table = budgets_table

    def ledger_for(self, request_id: str) -> list[dict[str, Any]]:
        blob = self.ledger.get(request_id.encode())
        return compact_json.loads(blob) if blob else []

    async def execute(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Run one command; answer with its status (`reprocessed`, `discarded`, `not_found`, …)."""
        command = Command.from_dict(raw)
        if command.action is Action.EXPIRE:
            return self._expire(command)
        if command.action is Action.SET_BUDGET:
            return self._set_budget(command)
        if command.action in RETRY_ACTIONS:
            answer, record = await self.retries.execute(command, self.clock())
            if record is not None:
                self._append_ledger(command.request_id, self.ledger_for(command.request_id), record)
                log_event(
                    log,
                    logging.INFO,
                    str(command.action),
                    request_id=command.request_id,
                    by=command.actor,
                    tier=record.get("tier"),
                )
            return answer
        key = find_dead_letter(self.dead_letters, command.request_id, self.store.partitions)
        if key is None:
            return {"request_id": command.request_id, "status": ReplayStatus.NOT_FOUND}
        entry = DeadLetterEntry.decode(self.dead_letters[key])
        command = replace(command, request_id=key.decode())
        if command.action is Action.DISCARD:
            return await self._discard(command, entry)
        return await self._replay(command, entry)

    async def _replay(self, command: Command, entry: DeadLetterEntry) -> dict[str, Any]:
        key = command.request_id
        rid = owner_id(key)
        ledger = self.ledger_for(rid)
        replays = sum(1 for record in ledger if record["action"] == Action.REPLAY)
        if replays >= self.max_replays:
            reason = f"{rid} was replayed {replays} times already (DLQ_MAX_REPLAYS={self.max_replays})"
            return {"request_id": key, "status": ReplayStatus.REFUSED, "reason": reason}
        current = self.store.load_state(rid)
        live = live_chain(current, rid in self.in_flight)
        if live is not None:
            reason = (
                f"{rid} is {live}: a replay now would give it a second outcome; replay this dead letter once "
                f"it has ended (or end it first: POST /retries/{rid}/dead-letter/)"
            )
            return {
                "request_id": key,
                "status": ReplayStatus.REFUSED,
                "reason": reason,
                "state": current_state(current),
            }
        if not command.force and current is not None and current.state == states.SUCCEEDED:
            reason = (
                f"{rid} has succeeded since it was dead-lettered (at {current.updated_at}); replaying would call the "
                "model again: send force=true to replay anyway"
            )
            return {"request_id": key, "status": ReplayStatus.REFUSED, "reason": reason, "state": states.SUCCEEDED}
        if command.payload is not None:
            problems = check_edit(rid, command.payload)
            if problems:
                return {"request_id": key, "status": ReplayStatus.INVALID, "reasons": problems}
            payload = json.dumps(command.payload).encode()
        elif entry.payload_truncated:
            reason = (
                f"the payload ({entry.payload_bytes} bytes) is over DLQ_MAX_PAYLOAD_BYTES: replay it with an edited "
                "payload"
            )
            return {"request_id": key, "status": ReplayStatus.INVALID, "reasons": [reason]}
        else:
            payload = entry.original_payload()
        at = self.clock()
        dlq_position = f"{entry.dlq['partition']}:{entry.dlq['offset']}"
        headers = {
            H_REPLAY_OF: dlq_position,
            H_REPLAY_COUNT: str(replays + 1),
            H_REPLAYED_BY: command.actor,
            H_REPLAYED_AT: str(at),
            H_ORIGINAL_TIMESTAMP: str(at),  # a fresh TTL clock, a clean retry count
            H_FIRST_SEEN: str(entry.first_seen or ""),
        }
        if H_SPENT in entry.headers:  # what it cost so far: the replay's result counts every attempt
            headers[H_SPENT] = entry.headers[H_SPENT]
        if entry.tenant:
            headers[H_TENANT] = entry.tenant
        # State first: the input agent may handle the replay the moment it is sent, and
        # its outcome (a quick success, a new retry) must not be overwritten by this.
        record = {
            "action": Action.REPLAY,
            "at": at,
            "by": command.actor,
            "edited": command.payload is not None,
            "replay_of": dlq_position,
            "error_class": entry.error_class,
            "replay_count": replays + 1,
            "forced": command.force,
        }
        self._append_ledger(rid, ledger, record)
        self.store.set_state(rid, states.REPROCESSED, at, replay_count=replays + 1, replayed_by=command.actor)
        with self.tracing.replay(
            entry.headers or {},
            request_id=rid,
            replay_count=replays + 1,
            replay_of=dlq_position,
            replayed_by=command.actor,
            edited=command.payload is not None,
            forced=command.force,
            error_class=entry.error_class,
        ) as trace_context:  # the replay's span: the replayed request's attempts continue its trace
            headers.update(trace_context)
            await self.store.send(self.input_topic, rid, payload, [(k, v.encode()) for k, v in headers.items()])
        await self._remove(key)
        self.store.counters.add("reprocessed")
        if entry.cost_usd and key == rid:  # no longer a failure: what it cost is counted again if it fails again
            self.store.counters.add(f"cost_failed|{entry.error_class}", -nusd_of(entry.cost_usd))
        metrics.replays.inc()
        log_event(
            log,
            logging.INFO,
            "replayed",
            request_id=rid,
            by=command.actor,
            replay_count=replays + 1,
            edited=command.payload is not None,
        )
        return {"request_id": key, "status": ReplayStatus.REPROCESSED, "replay_count": replays + 1}

    async def _discard(self, command: Command, entry: DeadLetterEntry) -> dict[str, Any]:
        key = command.request_id
        rid = owner_id(key)
        at = self.clock()
        await self._remove(key)
        self._append_ledger(
            rid,
            self.ledger_for(rid),
            {"action": Action.DISCARD, "at": at, "by": command.actor, "error_class": entry.error_class, "key": key},
        )
        state = self.store.load_state(rid)
        if (
            key == rid or state is None or state.get("dlq_key") == key
        ):  # discarding an invalid copy leaves the request's state alone
            self.store.set_state(rid, states.DISCARDED, at, discarded_by=command.actor)
        metrics.discards.inc()
        log_event(log, logging.INFO, "discarded", request_id=rid, key=key, by=command.actor)
        return {"request_id": key, "status": ReplayStatus.DISCARDED}

    def _expire(self, command: Command) -> dict[str, Any]:
        """Delete settled records the sweeper found old, unless they changed since."""
        tables = {
            self.store.requests.name: (self.store.requests, request_last_change),
            self.ledger.name: (self.ledger, ledger_last_change),
        }
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
        return {"request_id": command.request_id, "status": ReplayStatus.EXPIRED, "removed": removed}

    def _set_budget(self, command: Command) -> dict[str, Any]:
        """Keep a budget set at run time where every worker reads it (the stats changelog)."""
        key = command.request_id
        try:
            budget = Budget.parse(check_key(key), command.payload or {})
        except BudgetError as exc:
            return {"request_id": key, "status": ReplayStatus.INVALID, "reasons": [str(exc)]}
        if self.budgets_table is None:
            raise ValueError("this worker keeps no budgets")
        at = self.clock()
        record = {**budget.as_dict(), "set_by": command.actor, "set_at": at}
        self.budgets_table[budget_record_key(key)] = json.dumps(record, separators=(",", ":")).encode()
        log_event(log, logging.INFO, "budget_set", key=key, by=command.actor, **budget.as_dict())
        return {"request_id": key, "status": ReplayStatus.SET, "budget": record}

    def send_expired(self, commands: TopicT) -> Callable[[str, int, list[tuple[str, int]]], Awaitable[None]]:
        """How the retention sweep hands expired keys to this agent on their partition."""

        async def send(table: str, partition: int, expired: list[tuple[str, int]]) -> None:
            command = Command(
                Action.EXPIRE, expired[0][0], "retention", table=table, expired=[list(pair) for pair in expired]
            )
            await commands.send(key=expired[0][0].encode(), value=command.to_dict(), partition=partition)

        return send

    async def _remove(self, key: str) -> None:
        """Tombstone the compacted `dlq` topic, then drop the table entry."""
        await self.store.send(self.dlq_topic, key, None, [], partition=self.store.owner(owner_id(key)))
        self.recorder.remove(key.encode())

    def _append_ledger(self, request_id: str, ledger: list[dict[str, Any]], record: dict[str, Any]) -> None:
        self.ledger[request_id.encode()] = json.dumps([*ledger, record][-100:]).encode()
