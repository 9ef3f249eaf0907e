"""Reading the end of `input` while the worker is far behind it: a tenant's request written
behind another tenant's flood starts at once, not after the flood was read.

Faust's consumer hands an agent each partition's records in offset order, about 10,000 a
second here. Once read, a flood of 20,000 requests from one tenant is shared fairly with the
others (dlqapp.flowcontrol.fair), but another tenant's request written after the flood waits
until the flood before it was read: two seconds, each time.

`TailRead` follows the worker's `input` partitions. Once the door (where the agent takes
each event, dlqapp.processing.windows) is `lag` records or more behind a partition's end, a
consumer of its own (no group; read_committed under exactly_once) reads that partition from
its end on and hands each record to `claim`, which decides (dlqapp.wiring): a valid request
of a tenant with little waiting, owned here, runs ahead of its turn; any other record is left
to the door. When the door reaches the record the tail read would read next, the partition's
tail read stops.

That a record run ahead of its turn is neither lost nor run twice, through a crash or a
rebalance, is dlqapp.kafka.acks' rule (ahead tickets): its offset is acked only once the
consumer's own event at that offset came through the door, and it is sealed into the
partition's progress once its step ended.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol

from aiokafka import TopicPartition

from dlqapp.observability.logs import log_event

log = logging.getLogger(__name__)

CHECK_S = 0.1
"""How often the partitions' lag is looked at while no tail is read."""
BATCH = 500
"""Records a tail read takes at most at once."""
TURN_S = 0.005
"""The longest a batch is looked at before the event loop gets a turn: a batch of a flood
looked at in one go held every other task (a due retry among them) for tens of
milliseconds, and a turn every few records slowed the tail read behind the flood's door."""
LOG_EVERY_S = 60.0
"""At most one `tail_read_started` line this often (with the starts since the last one)."""
RETRY_S = 5.0
"""After a failure (the broker unreachable, a refusal), the tail read starts over this much later."""


class TailConsumer(Protocol):
    """What the tail read uses of aiokafka's `AIOKafkaConsumer` (no group, assigned by hand)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def assign(self, partitions: list[TopicPartition]) -> None: ...

    def seek(self, partition: TopicPartition, offset: int) -> None: ...

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[Any]]: ...


Ends = Callable[[int], int | None]
"""`ends(partition)`: the offset after the last record of the `input` partition, as the
worker's consumer last heard (None: not known)."""
Expected = Callable[[int], int | None]
"""`expected(partition)`: the offset the door expects next (None: nothing came through it)."""
Claim = Callable[[Any], Awaitable[None]]
"""`claim(record)`: a record the tail read got (aiokafka's `ConsumerRecord`)."""
Partitions = Callable[[], Iterable[int]]
"""The worker's `input` partitions in its current assignment."""


def tail_reads(
    partitions: Iterable[int], *, ends: Ends, expected: Expected, reading: Mapping[int, int], lag: int
) -> tuple[dict[int, int], set[int]]:
    """The partitions whose tail read should start (and at which offset), and those whose
    tail read should stop, given where each stands (`reading`: partition → next offset read)."""
    start: dict[int, int] = {}
    stop: set[int] = set()
    for partition in partitions:
        door = expected(partition)
        if partition in reading:
            if door is None or door >= reading[partition]:
                stop.add(partition)
            continue
        end = ends(partition)
        if door is not None and end is not None and end - door >= lag:
            start[partition] = end
    return start, stop


class TailRead:
    """Reads the ends of the worker's `input` partitions while the door is far behind (module doc)."""

    def __init__(
        self,
        new_consumer: Callable[[], TailConsumer],
        *,
        topic: str,
        lag: int,
        partitions: Partitions,
        ends: Ends,
        expected: Expected,
    ) -> None:
        self._new_consumer = new_consumer
        self.topic = topic
        self.lag = lag
        self._assigned = partitions
        self._ends = ends
        self._expected = expected
        self._consumer: TailConsumer | None = None
        self._partitions: frozenset[int] = frozenset()
        self._reading: dict[int, int] = {}
        """Partition → the next offset its tail read reads."""
        self.claimed = 0
        """Records handed to `claim`, since the start."""
        self._logged_at = float("-inf")
        self._unlogged = 0

    @property
    def reading(self) -> dict[int, int]:
        return dict(self._reading)

    def assigned(self) -> None:
        """A new assignment began: follow its `input` partitions."""
        self._partitions = frozenset(self._assigned())
        self._reading.clear()

    def revoked(self) -> None:
        """The assignment is being handed back: read nothing until the next one."""
        self._partitions = frozenset()
        self._reading.clear()

    async def run(self, claim: Claim) -> None:
        """The tail read's life (a task of the input agent's): look, read while behind, repeat.

        It only lets requests start earlier: a failure stops it for RETRY_S, never the worker
        (what it started is the ack rule's, what it did not read the door reads)."""
        if self.lag <= 0:
            return
        try:
            while True:
                try:
                    await self.step(claim)
                except Exception as exc:
                    log_event(log, logging.WARNING, "tail_read_failed", error=repr(exc)[:500], retry_in_s=RETRY_S)
                    await self._close()
                    await asyncio.sleep(RETRY_S)
        finally:
            await self._close()

    def _log_start(self, start: dict[int, int]) -> None:
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY_S:
            self._unlogged += 1
            return
        behind = sum(offset - (self._expected(partition) or 0) for partition, offset in start.items())
        more, self._unlogged, self._logged_at = self._unlogged, 0, now
        log_event(
            log,
            logging.INFO,
            "tail_read_started",
            topic=self.topic,
            partitions=sorted(start),
            behind=behind,
            starts_since_last_line=more or None,
        )

    async def _close(self) -> None:
        self._reading.clear()
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()

    async def step(self, claim: Claim) -> None:
        """Start and stop the partitions' tail reads, then read what their ends hold (or wait)."""
        start, stop = tail_reads(
            self._partitions, ends=self._ends, expected=self._expected, reading=self._reading, lag=self.lag
        )
        if start or stop:
            await self._change(start, stop)
        if not self._reading:
            await asyncio.sleep(CHECK_S)
            return
        assert self._consumer is not None
        batches = await self._consumer.getmany(timeout_ms=int(CHECK_S * 1000), max_records=BATCH)
        turn_at = time.monotonic() + TURN_S
        for tp, records in batches.items():
            for record in records:
                if self._reading.get(tp.partition) != record.offset:
                    break  # stopped, or sought elsewhere, while this batch was read
                self._reading[tp.partition] = record.offset + 1
                self.claimed += 1
                await claim(record)
                if time.monotonic() >= turn_at:
                    await asyncio.sleep(0)
                    turn_at = time.monotonic() + TURN_S

    async def _change(self, start: dict[int, int], stop: set[int]) -> None:
        for partition in stop:
            del self._reading[partition]
        self._reading.update(start)
        if start:
            self._log_start(start)
        if self._consumer is None:
            self._consumer = self._new_consumer()
            await self._consumer.start()
        self._consumer.assign([TopicPartition(self.topic, p) for p in sorted(self._reading)])
        for partition, offset in self._reading.items():
            self._consumer.seek(TopicPartition(self.topic, partition), offset)
