"""Parking what the pipeline decided: a retry on its tier until its due time, or a request
held over its budget until its next look. Both wait in the parked-retries table
(dlqapp.retries.parked), in the step that records the request's state."""

from __future__ import annotations

import logging

from faust import TopicT

from dlqapp.core import states
from dlqapp.core.clock import Clock
from dlqapp.core.envelope import Envelope
from dlqapp.core.outcomes import RetryAt
from dlqapp.core.tiers import Tier
from dlqapp.observability.logs import log_event
from dlqapp.retries.parked import ParkedRetries
from dlqapp.tables.request_store import RequestStore

log = logging.getLogger("dlqapp.retries.scheduler")


class RetryParking:
    """Parks a decided retry on its tier until its due time."""

    def __init__(
        self, store: RequestStore, parked: ParkedRetries, *, tiers: tuple[tuple[Tier, TopicT], ...], clock: Clock
    ) -> None:
        self.store = store
        self.parked = parked
        self.tiers = tiers
        self.clock = clock

    async def park(self, outcome: RetryAt, envelope: Envelope) -> None:
        """Send the retry to its tier topic, park it under its due time, record `retry_scheduled`."""
        envelope.due_ms = outcome.due_ms
        tier, topic = self.tiers[outcome.tier_index]
        await self.store.send(topic, envelope.request_id, envelope.payload, envelope.headers())
        self.parked.store(envelope, tier)
        failure = outcome.failure
        self.store.set_state(
            envelope.request_id,
            states.RETRY_SCHEDULED,
            self.clock(),
            attempts=envelope.attempts,
            tier=tier.topic,
            due=outcome.due_ms,
            error_class=failure.error_class.value,
            last_error=failure.message,
        )
        log_event(
            log,
            logging.DEBUG,
            "retry_scheduled",
            request_id=envelope.request_id,
            attempt=envelope.attempts,
            tier=tier.label,
            due=outcome.due_ms,
            error_class=failure.error_class.value,
        )

    async def hold(self, envelope: Envelope, until_ms: int, reason: str, tenant: str) -> None:
        """Park a request held over its budget until `until_ms` (its next look), with the state
        `budget_held`. No tier message: it is not a retry, and no attempt was spent on it."""
        envelope.due_ms = until_ms
        envelope.held = True
        self.parked.store(envelope, self.parked.tier_of(envelope))
        self.store.set_state(
            envelope.request_id,
            states.BUDGET_HELD,
            self.clock(),
            attempts=envelope.attempts,
            due=until_ms,
            tenant=tenant,
            held_because=reason,
        )
        log_event(
            log,
            logging.INFO,
            "budget_held",
            request_id=envelope.request_id,
            tenant=tenant,
            until=until_ms,
            reason=reason,
        )
