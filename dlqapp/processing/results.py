"""A success made visible: the result on `results`, then the request's state.

The call was paid for, so its answer must land: a result larger than the topic holds
loses its attempt history first, then half its output at a time (`output_truncated`).
"""

from __future__ import annotations

import logging

from faust import TopicT

from dlqapp.core import compact_json, states
from dlqapp.core.clock import Clock
from dlqapp.core.envelope import Envelope, Result
from dlqapp.core.headers import H_SOURCE
from dlqapp.core.outcomes import Succeeded
from dlqapp.core.requests import Request
from dlqapp.kafka.transaction_errors import RecordTooLarge
from dlqapp.observability import metrics
from dlqapp.observability.logs import log_event
from dlqapp.tables.request_store import RequestStore, as_header_pairs

log = logging.getLogger("dlqapp.processing.pipeline")

RESULT_SHRINKS = 40
"""Halvings a result too large for the results topic may take (history first, then its output)."""


class ResultPublisher:
    """Publishes a request's success on the `results` topic and records it as succeeded."""

    def __init__(self, store: RequestStore, topic: TopicT, clock: Clock) -> None:
        self.store = store
        self.topic = topic
        self.clock = clock

    async def _send(self, result: Result, headers: list[tuple[str, bytes]]) -> None:
        """Publish `result`; one larger than the topic holds loses its history, then half its
        output at a time (`output_truncated`): the call was paid for, its answer must land."""
        for _ in range(RESULT_SHRINKS):
            try:
                await self.store.send(self.topic, result.request_id, result.to_bytes(), headers)
                return
            except RecordTooLarge:
                if result.history:
                    result.history = None
                else:
                    result.output_bytes = result.output_bytes or len(result.output.encode())
                    result.output = result.output[: len(result.output) // 2]
        raise RecordTooLarge(f"the result of {result.request_id} does not fit the results topic")

    async def publish(self, outcome: Succeeded, envelope: Envelope, request: Request | None) -> None:
        """Send the result (its output, usage, cost and history), then mark the request succeeded."""
        at = self.clock()
        output = outcome.output
        result = Result(
            request_id=envelope.request_id,
            model=output.model,
            output=output.text,
            attempts=envelope.attempts,
            latency_ms=at - envelope.original_timestamp,
            completed_at=at,
            metadata=request.metadata if request else {},
            usage=output.usage or None,
            history=envelope.history,
            spent=envelope.spent,
            tenant=envelope.tenant,
        )
        headers = {**envelope.lineage, H_SOURCE: compact_json.dumps_str(envelope.source)}
        await self._send(result, as_header_pairs(headers))
        self.store.set_state(
            envelope.request_id,
            states.SUCCEEDED,
            at,
            attempts=envelope.attempts,
            model=output.model,
            attempt_log=envelope.history,
        )
        metrics.requests.labels("succeeded").inc()
        metrics.end_to_end.observe(max(0, at - envelope.original_timestamp) / 1000)
        log_event(
            log,
            logging.DEBUG,
            "succeeded",
            request_id=envelope.request_id,
            attempt=envelope.attempts,
            model=output.model,
        )
