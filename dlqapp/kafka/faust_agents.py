"""The Faust agent internals dlqapp relies on: the value and the reply of an `Agent.ask()`.

Checked against faust-streaming 0.15.3 (`Agent._slurp`, `Agent._reply`). dlqapp's operator
agent reads its events with `stream.noack().events()` and acks them by its own rule
(dlqapp.kafka.acks), so it answers an `ask()` itself, once the command's step committed,
the way Faust answers what an agent yields (dlqapp.kafka.replies sends the answer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from faust.agents.models import ReqRepRequest
from mode.utils.text import want_str


@dataclass(frozen=True)
class ReplyTarget:
    """Where the answer to an `ask()` goes: the asking worker's reply topic."""

    topic: str
    correlation_id: str | None


def asked_value(event: Any) -> Any:
    """The value an `ask()` sent (Faust wraps it in a `ReqRepRequest`), else the event's value."""
    value = event.value
    return value.value if isinstance(value, ReqRepRequest) else value


def reply_target(event: Any) -> ReplyTarget | None:
    """Whom to answer (the request's `reply_to`, or Faust's headers); None when nobody asked."""
    value = event.value
    if isinstance(value, ReqRepRequest):
        return ReplyTarget(value.reply_to, value.correlation_id)
    reply_to_bytes = event.headers.get("Faust-Ag-ReplyTo") if event.headers else None
    if not reply_to_bytes:
        return None
    correlation_bytes = event.headers.get("Faust-Ag-CorrelationId")
    return ReplyTarget(want_str(reply_to_bytes), want_str(correlation_bytes) if correlation_bytes else None)


def reply_record(agent: Any, event: Any, answer: Any, target: ReplyTarget) -> Any:
    """The record Faust's `Agent._reply` sends: the answer with the asker's correlation id."""
    return agent._response_class(answer)(key=event.key, value=answer, correlation_id=target.correlation_id)
