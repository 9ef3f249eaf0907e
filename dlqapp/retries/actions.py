"""Operator actions on parked retries: run now, dead-letter now (on the owning worker).

Both run inside the operator agent's stream on the partition that owns the request
(like replays and discards, `dlqapp.deadletters.operator`), and answer with a ledger
record for it to append.

- **Run now** hands the parked entry to the due agent through the due topic, exactly as
  the retry timer does when the entry is due: the due agent attempts it and deletes the
  entry only after the outcome is on the broker. So at-least-once holds as for any timer
  fire; a timer fire of the same entry meanwhile is ignored (`RetryScheduler.running`).
- **Dead-letter now** sends the parked envelope, with its attempt history, to the DLQ as an
  exhausted retry would, records the state, and only then deletes the entry (a crash in
  between leaves it parked: it runs again when due, at-least-once). While it works the
  entry is claimed, so a due message for it meanwhile is ignored: one outcome, never two.
"""

from __future__ import annotations

from dlqapp.core.commands import Action, Answer, Command, ReplayStatus
from dlqapp.core.errors import ErrorClass
from dlqapp.core.in_flight import InFlight
from dlqapp.core.outcomes import DeadLetter
from dlqapp.deadletters.writer import DeadLetterWriter
from dlqapp.retries.keys import decode_parked_key
from dlqapp.retries.parked import ParkedRetries
from dlqapp.retries.scheduler import RetryScheduler
from dlqapp.tables.request_store import RequestStore


def error_class_of(value: str | None) -> ErrorClass:
    try:
        return ErrorClass(value or "unknown")
    except ValueError:
        return ErrorClass.UNKNOWN


class RetryActions:
    """Carries out `run_now` and `dead_letter_now` commands on the owning worker."""

    def __init__(
        self,
        parked: ParkedRetries,
        scheduler: RetryScheduler,
        *,
        dead_letters: DeadLetterWriter,
        in_flight: InFlight,
        store: RequestStore,
    ) -> None:
        self.parked = parked
        self.scheduler = scheduler
        self.dead_letters = dead_letters
        self.in_flight = in_flight
        self.store = store

    async def execute(self, command: Command, at: int) -> Answer:
        """(answer, ledger record or None) for one retry command."""
        rid = command.request_id
        partition = self.store.owner(rid)
        state = self.store.load_state(rid)
        keys = await self.parked.keys_of(rid, partition, hint_due_ms=state.due if state is not None else None)
        if not keys:
            return {
                "request_id": rid,
                "status": ReplayStatus.NOT_FOUND,
                "reason": f"no parked retry for {rid!r} (it may have run already)",
            }, None
        key = keys[0]
        if rid in self.in_flight or self.scheduler.is_handed_over(key):
            return {
                "request_id": rid,
                "status": ReplayStatus.REFUSED,
                "reason": f"{rid} is being attempted right now",
            }, None
        if command.action is Action.RUN_NOW:
            return await self._run_now(command, key, partition=partition, at=at)
        return await self._dead_letter_now(command, keys, at)

    async def _run_now(self, command: Command, key: bytes, *, partition: int, at: int) -> Answer:
        envelope = self.parked.get(key)
        if envelope is None:
            return {"request_id": command.request_id, "status": ReplayStatus.NOT_FOUND}, None
        due_ms, _ = decode_parked_key(key)
        tier = self.parked.tier_of(envelope).label
        await self.scheduler.hand_over_now(key, partition)
        record = {
            "action": Action.RUN_NOW,
            "at": at,
            "by": command.actor,
            "tier": tier,
            "due_at": due_ms,
            "attempt": envelope.attempts + 1,
            "error_class": envelope.error_class,
        }
        return {"request_id": command.request_id, "status": ReplayStatus.FIRED, "tier": tier, "due_at": due_ms}, record

    async def _dead_letter_now(self, command: Command, keys: list[bytes], at: int) -> Answer:
        key = keys[0]
        running = self.scheduler.running
        running.update(keys)  # claim: a due message for these keys meanwhile is ignored
        try:
            envelope = self.parked.get(key)
            if envelope is None:
                return {"request_id": command.request_id, "status": ReplayStatus.NOT_FOUND}, None
            due_ms, _ = decode_parked_key(key)
            tier = self.parked.tier_of(envelope)
            error_class = error_class_of(envelope.error_class)
            reason = (
                f"dead-lettered by {command.actor} while parked in {tier.label} (after {envelope.attempts} "
                f"attempts); last error: {envelope.last_error or error_class.value}"
            )
            await self.dead_letters.write(DeadLetter(error_class, reason[:1000], final=True), envelope)
            for stale in keys:  # copies of its retry chain left by a crash go with it
                copy = self.parked.get(stale)
                if copy is not None:
                    self.parked.delete(stale, self.parked.tier_of(copy))
                self.scheduler.handed_over.pop(stale, None)
        finally:
            running.difference_update(keys)
        record = {
            "action": Action.DEAD_LETTER_NOW,
            "at": at,
            "by": command.actor,
            "tier": tier.label,
            "due_at": due_ms,
            "error_class": error_class.value,
        }
        return {
            "request_id": command.request_id,
            "status": ReplayStatus.DEAD_LETTERED,
            "tier": tier.label,
            "error_class": error_class.value,
        }, record
