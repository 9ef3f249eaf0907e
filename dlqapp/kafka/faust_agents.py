"""The Faust agent internals dlqapp relies on: the value and the reply of an `Agent.ask()`.

Checked against faust-streaming 0.15.3 (`Agent._slurp`, `Agent._reply`). dlqapp's operator
agent reads its events with `stream.noack().events()` and acks them by its own rule
(dlqapp.kafka.acks), so it answers an `ask()` itself, once the command's step committed,
the way Faust answers what an agent yields.
"""

from __future__ import annotations

from typing import Any

from faust.agents.models import ReqRepRequest
from mode.utils.text import want_str


def asked_value(event: Any) -> Any:
    """The value an `ask()` sent (Faust wraps it in a `ReqRepRequest`), else the event's value."""
    value = event.value
    return value.value if isinstance(value, ReqRepRequest) else value


async def answer_asker(agent: Any, event: Any, answer: Any) -> None:
    """Send `answer` to whoever asked (`Agent._reply`); nothing when nobody did."""
    value = event.value
    reply_to: str | None = None
    correlation_id: str | None = None
    if isinstance(value, ReqRepRequest):
        reply_to, correlation_id = value.reply_to, value.correlation_id
    elif event.headers:
        reply_to_bytes = event.headers.get("Faust-Ag-ReplyTo")
        if reply_to_bytes:
            reply_to = want_str(reply_to_bytes)
            correlation_bytes = event.headers.get("Faust-Ag-CorrelationId")
            correlation_id = want_str(correlation_bytes) if correlation_bytes else None
    if reply_to is not None:
        await agent._reply(event.key, answer, reply_to, correlation_id)
