"""Faust's aiokafka consumer thread as dlqapp runs it: fetch wait, due hints first, close and wake.

Each method names the private member it touches and why. Checked against faust-streaming
0.15.3; read these first after an upgrade. The consumer that starts this thread is
dlqapp.kafka.faust_consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

from dlqapp.kafka import idle_fetch
from dlqapp.observability.logs import log_event

_log = logging.getLogger("dlqapp.kafka.delivery")


def stop_on_its_loop(consumer: Any, loop: asyncio.AbstractEventLoop) -> None:
    """Stop an aiokafka `consumer` on `loop`, the event loop it lives on, from any thread.

    Faust's `AIOKafkaConsumerThread.close()` (called when a rebalance reaches an app that is
    stopping: `App._on_rebalance_when_stopped`) runs the consumer's client and coordinator
    `close()` on the app's loop, while they belong to the consumer thread's. Under uvloop
    that crossing crashed the process with SIGSEGV (a fenced worker restarting in place
    while its group rebalanced). aiokafka's own `stop()` closes the coordinator, the fetcher
    and the client, in that order; run on the right loop, it is only asked for here, and
    Faust's later `stop()` in the thread finds it done."""
    if consumer is None or loop.is_closed():
        return
    with contextlib.suppress(RuntimeError):  # the loop closed just now: the thread is gone
        asyncio.run_coroutine_threadsafe(consumer.stop(), loop)


def wake_polls(consumer: Any) -> None:
    """End the wait of every poll of `consumer` (an aiokafka consumer) for new records: each
    looks again at its partitions and, finding nothing, waits on. aiokafka wakes a poll only
    when a fetch brings records, and a poll only takes records of the partitions Faust counts
    as active (a live set) when it looks; run on the consumer's own loop."""
    fetcher = getattr(consumer, "_fetcher", None)
    for waiter in list(getattr(fetcher, "_fetch_waiters", ())):
        if not waiter.done():
            waiter.set_result(None)


class FetchWaitConsumerThread(AIOKafkaConsumerThread):
    """Faust's consumer thread with the fetch wait, first topics and isolation level that
    `dlq_consumer_class` (dlqapp.kafka.faust_consumer) sets on a subclass."""

    fetch_max_wait_ms = 1500
    first_topics: frozenset[str] = frozenset()
    read_committed = False
    close_asked = False

    def wake_fetch(self) -> None:
        """From any thread: have a poll that waits for records look again at the partitions
        active now (`wake_polls`, run on this thread's loop)."""
        loop = self.thread_loop
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed just now: the thread is gone
                loop.call_soon_threadsafe(wake_polls, self._consumer)

    def close(self) -> None:
        """Faust's close, on the consumer thread's own loop (`stop_on_its_loop`); once (Faust
        calls it at both ends of a rebalance)."""
        if self.close_asked:
            return
        self.close_asked = True
        log_event(_log, logging.INFO, "consumer_closing", reason="a rebalance reached the worker while it stops")
        stop_on_its_loop(self._consumer, self.thread_loop)

    async def on_start(self) -> None:
        """Faust's start (which creates and starts the consumer), then the fetcher's wait
        grows while nothing comes (dlqapp.kafka.idle_fetch)."""
        await super().on_start()
        assert self._consumer is not None  # created by Faust's on_start
        idle_fetch.install(self._consumer._fetcher, self.fetch_max_wait_ms)

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = self.fetch_max_wait_ms  # read by AIOKafkaConsumer.start() for its Fetcher
        if self.read_committed:
            # Faust reads committed records only in its own exactly_once mode, which also
            # starts its transactions; dlqapp owns its transactions (dlqapp.kafka.transactions)
            consumer._isolation_level = "read_committed"  # read by AIOKafkaConsumer.start() too
        return consumer

    async def _fetch_records(
        self, consumer: Any, active_partitions: Any, timeout: float | None = None, max_records: int | None = None
    ) -> Any:
        """Faust's fetch, with the records of `first_topics` taken before any other.

        aiokafka's `Fetcher.fetched_records` fills a poll from the partitions in the order
        their records were fetched and leaves a partition in line until it is drained, so a
        due hint fetched after a few thousand input records waited until the agents had been
        handed all of them (200-350 ms at the start of an input flood, measured here)."""
        first = {tp for tp in active_partitions or () if tp.topic in self.first_topics}
        if not first or not self.consumer.flow_active or consumer._closed or consumer._fetcher._closed:
            return await super()._fetch_records(consumer, active_partitions, timeout=timeout, max_records=max_records)
        fetcher = consumer._fetcher
        with fetcher._subscriptions.fetch_context():
            records = await fetcher.fetched_records(first, timeout=0, max_records=max_records)
        taken = sum(len(batch) for batch in records.values())
        if max_records is not None and taken >= max_records:
            return records
        # All partitions again: a due hint fetched while this waits must end the wait.
        rest = await super()._fetch_records(
            consumer,
            active_partitions,
            timeout=0 if records else timeout,
            max_records=None if max_records is None else max_records - taken,
        )
        for tp, batch in rest.items():
            records[tp] = records[tp] + batch if tp in records else batch
        return records
