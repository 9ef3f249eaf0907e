"""Table writes confirmed before the event that made them is acked.

Faust buffers each table write as a changelog message and commits offsets after
`producer.flush()`, which drains its own buffer only "at most" for a while: under broker
latency an offset can be committed before the changelog records of the same step are on
the broker, and a `kill -9` then loses them (a parked retry the next owner never sees).
`ConfirmedTable` hands every changelog send of a handler to `changelog_barrier()`, which
waits for the broker to confirm them all; the in-flight window acks only after that.
"""

from __future__ import annotations

import asyncio
import contextvars
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

import faust

_end_of_step: list[Callable[[], None]] = []


def at_end_of_step(hook: Callable[[], None]) -> None:
    """Run `hook` at the end of every stream step, inside it (e.g. to write counters)."""
    _end_of_step.append(hook)


_pending: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("dlqapp_changelog_pending", default=None)


class ConfirmedTable(faust.Table):
    """A Faust table whose changelog sends can be awaited (see `changelog_barrier`)."""

    def send_changelog(self, *args: Any, **kwargs: Any) -> Any:
        future = super().send_changelog(*args, **kwargs)
        pending = _pending.get()
        if pending is not None:
            pending.append(future)
        return future


@asynccontextmanager
async def changelog_barrier() -> AsyncIterator[None]:
    """On leaving the block, wait until every table write made inside it is on the broker."""
    pending: list[Any] = []
    token = _pending.set(pending)
    try:
        yield
        for hook in _end_of_step:
            hook()
        while pending:
            batch, pending[:] = list(pending), []
            await asyncio.gather(*batch)
    finally:
        _pending.reset(token)
