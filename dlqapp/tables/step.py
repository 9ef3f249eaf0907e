"""One stream step and where it is found: what a handler wrote, counted and sent for its
event (dlqapp.tables.steps carries it to Kafka)."""

from __future__ import annotations

import asyncio
import contextvars
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from dlqapp.kafka.transaction_errors import Position
from dlqapp.kafka.transactions import PartitionTransaction

OnEnd = Callable[[asyncio.Future[None] | None], None]
"""Called once a step that succeeded has handed its work over (see `StreamSteps.step`)."""


class OutsideStep(RuntimeError):
    """A table write or an output outside any stream step: a bug, never a quieter path."""


class StepTable(Protocol):
    """What a step needs of a table it wrote (dlqapp.tables.durability.ConfirmedTable)."""

    name: str

    @property
    def changelog_topic_name(self) -> str: ...

    def put_local(self, partition: int, key: bytes, value: bytes | None) -> None: ...

    def persisted(self, partition: int, offset: int) -> None: ...


class StepContext:
    """Where the stream step running now is found (one per worker, shared by its tables)."""

    def __init__(self) -> None:
        self._current: contextvars.ContextVar[Step | None] = contextvars.ContextVar("dlqapp_step", default=None)

    def current(self) -> Step | None:
        return self._current.get()

    def required(self, what: str) -> Step:
        """The current step; `OutsideStep` when there is none."""
        step = self._current.get()
        if step is None:
            raise OutsideStep(f"{what} outside a stream step")
        return step

    def enter(self, step: Step) -> contextvars.Token[Step | None]:
        return self._current.set(step)

    def leave(self, token: contextvars.Token[Step | None]) -> None:
        self._current.reset(token)


class Step:
    """One handler's work on one event: its table writes, counts and outputs."""

    __slots__ = (
        "after_sent",
        "called",
        "committed",
        "counts",
        "futures",
        "on_end",
        "partition",
        "position",
        "records",
        "sent",
        "transaction",
        "waiting",
    )

    def __init__(self, partition: int, position: Position | None = None, on_end: OnEnd | None = None) -> None:
        self.partition = partition
        self.position = position
        self.on_end = on_end
        """The consumed record the step handles (named as the culprit if it breaks its transaction)."""
        self.records: dict[tuple[StepTable, bytes], bytes | None] = {}
        self.counts: Counter[str] = Counter()
        self.futures: list[Awaitable[Any]] = []
        self.transaction: PartitionTransaction | None = None
        self.sent = False
        self.after_sent: list[Callable[[], None]] = []
        self.committed: asyncio.Future[None] | None = None
        """Under exactly_once, once the step ended: resolves when its transaction committed
        (None when it sent nothing). Shared: await it through `asyncio.shield`."""
        self.waiting = False
        """The handler waits for leave to call its backend (the breaker, the rate gate, a
        backend slot) and has not called it in this wait."""
        self.called = False
        """The handler made a backend call that counts as an attempt (paid for, perhaps)."""

    @property
    def only_waiting(self) -> bool:
        """Waiting (above), no attempt made and nothing sent: cancelling it now loses
        nothing, pays for nothing twice and spoils no transaction; its event is handed back
        and handled again by the partition's owner."""
        return self.waiting and not self.called and not self.sent and not self.futures

    def wrote(self, table: StepTable, key: bytes, value: bytes | None) -> None:
        """`table` holds `key` = `value` (None: deleted) in this step's partition now."""
        self.records[(table, key)] = value


def after_commit(committed: asyncio.Future[None] | None, hook: Callable[[], None]) -> None:
    """Run `hook` now when there is no commit to wait for, else once `committed` has
    committed; never when it failed."""
    if committed is None:
        hook()
    else:

        def on_done(done: asyncio.Future[None]) -> None:
            if not done.cancelled() and done.exception() is None:
                hook()

        committed.add_done_callback(on_done)


def tables_of(records: Mapping[tuple[StepTable, bytes], bytes | None]) -> set[str]:
    """The names of the tables a step wrote (for logs and tests)."""
    return {table.name for table, _ in records}
