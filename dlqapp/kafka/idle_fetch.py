"""A longer fetch wait while nothing comes: an idle worker's fetches cost a tenth.

The consumer's fetch waits at the broker at most `DLQ_FETCH_MAX_WAIT` (50 ms) for records,
short because a partition left out of a fetch (paused, or with records still buffered) is
fetched again only after that fetch returns (dlqapp.kafka.faust_consumer). An idle worker
then asks every broker for every partition it owns 20 times a second: about 84 partitions
at the default 12, most of an idle worker's CPU. A fetch that includes a partition returns
as soon as a record lands on it, whatever its wait, so once `EMPTY_FETCHES_TO_IDLE` fetches
in a row brought nothing (no partition paused or buffered then: those follow records) the
wait becomes `IDLE_FETCH_WAIT_MS`, and the first fetch that brings records sets it back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

IDLE_FETCH_WAIT_MS = 500
"""The fetch wait of an idle consumer (Kafka's own default)."""

EMPTY_FETCHES_TO_IDLE = 20
"""Empty fetches in a row after which a consumer is idle (about a second at 50 ms)."""


class IdleFetchWait:
    """Sets a fetcher's wait from what its fetches bring (module doc)."""

    def __init__(self, fetcher: Any, busy_ms: int, idle_ms: int = IDLE_FETCH_WAIT_MS) -> None:
        self.fetcher = fetcher
        self.busy_ms = busy_ms
        self.idle_ms = max(idle_ms, busy_ms)
        self.empty_in_a_row = 0

    @property
    def idle(self) -> bool:
        return self.fetcher._fetch_max_wait_ms == self.idle_ms != self.busy_ms

    def fetched(self, brought_records: bool) -> None:
        """One fetch returned; `brought_records`: it had records for the consumer."""
        if brought_records:
            self.empty_in_a_row = 0
            self.fetcher._fetch_max_wait_ms = self.busy_ms
            return
        self.empty_in_a_row += 1
        if self.empty_in_a_row >= EMPTY_FETCHES_TO_IDLE:
            self.fetcher._fetch_max_wait_ms = self.idle_ms


def install(fetcher: Any, busy_ms: int) -> IdleFetchWait:
    """Have aiokafka's `fetcher` wait longer while idle: its `_proc_fetch_request` (which
    returns whether the fetch woke the consumer with records) tells an `IdleFetchWait`."""
    fetch: Callable[..., Awaitable[bool]] = fetcher._proc_fetch_request
    wait = IdleFetchWait(fetcher, busy_ms)

    async def proc_fetch_request(*args: Any, **kwargs: Any) -> bool:
        brought = await fetch(*args, **kwargs)
        wait.fetched(bool(brought))
        return brought

    fetcher._proc_fetch_request = proc_fetch_request
    return wait
