"""How a retry is parked: where the pipeline's `RetryAt` outcome becomes a waiting retry.

In one stream step: the tier message (for visibility, confirmed by the broker), the
parked entry under its due time, and the request's state `retry_scheduled`, all on the
partition that owns the request.
"""

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
from dlqapp.tables.partition_io import PartitionIO

log = logging.getLogger("dlqapp.retries.parking")


class RetryParking:
    """Parks a decided retry on its tier until its due time."""

    def __init__(
        self, io: PartitionIO, parked: ParkedRetries, tiers: tuple[tuple[Tier, TopicT], ...], clock: Clock
    ) -> None:
        self.io = io
        self.parked = parked
        self.tiers = tiers
        self.clock = clock

    async def park(self, outcome: RetryAt, envelope: Envelope) -> None:
        envelope.due_ms = outcome.due_ms
        tier, topic = self.tiers[outcome.tier_index]
        await self.io.send(topic, envelope.request_id, envelope.payload, envelope.headers())
        self.parked.store(envelope, tier)
        failure = outcome.failure
        self.io.set_state(
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
