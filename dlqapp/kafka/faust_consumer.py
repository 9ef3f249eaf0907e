"""The Faust consumer internals dlqapp relies on: records in offset order, the fetch wait, reading committed only.

Each helper names the private member it touches and why. Checked against faust-streaming
0.15.3; read these first after an upgrade. `dlq_consumer_class` is installed by
`App._new_consumer` (dlqapp.wiring.faust_app); the rule it enforces is
dlqapp.kafka.delivery_order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from time import monotonic
from typing import Any

from faust.transport.consumer import CONSUMER_FETCHING, ensure_TP
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
from faust.types import TP

from dlqapp.kafka.delivery_order import DeliveryOrder, Verdict
from dlqapp.kafka.faust_consumer_thread import FetchWaitConsumerThread
from dlqapp.observability.logs import log_event

_log = logging.getLogger("dlqapp.kafka.delivery")


IDLE_CHECK_S = 1.0
"""How often an idle consumer looks for partitions whose position passed undelivered records."""


def dlq_consumer_class(
    fetch_max_wait_ms: int, first_topics: frozenset[str] = frozenset(), read_committed: bool = False
) -> type:
    """Faust's aiokafka consumer with aiokafka's `fetch_max_wait_ms` set and records handed
    to the agents strictly in offset order (dlqapp.kafka.delivery_order).

    Fetch wait: Faust passes a fixed `fetch_max_wait_ms=1500`
    (`AIOKafkaConsumerThread._create_worker_consumer`) and has no setting for it. aiokafka
    leaves a partition out of a fetch while records of it are still buffered, and sends no
    new fetch to a broker until the last one returns, so a record written meanwhile (a due
    retry's hint) waited up to 1.5 s.

    First topics: each poll takes the records of `first_topics` (the due hints) before any
    other (`FetchWaitConsumerThread._fetch_records`).

    `read_committed`: records of aborted or open transactions are never handed over (and
    the tables recover only committed writes), under DLQ_PROCESSING_GUARANTEE=exactly_once.

    Order: `Consumer._drain_messages` (the loop that hands fetched records to the streams)
    and `perform_seek` (the seek to committed offsets after each rebalance) are replaced,
    and the partitions a rebalance revokes are forgotten (`on_partitions_revoked`).
    """
    thread_class = type(
        "FetchWaitConsumerThread",
        (FetchWaitConsumerThread,),
        {"fetch_max_wait_ms": fetch_max_wait_ms, "first_topics": first_topics, "read_committed": read_committed},
    )

    committed_only = read_committed

    class OrderedConsumer(_OrderedConsumer):
        read_committed = committed_only

        def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
            return thread_class(self, loop=self.loop, beacon=self.beacon)

    return OrderedConsumer


class _OrderedConsumer(AIOKafkaConsumer):
    """See `dlq_consumer_class`. Checked against Faust 0.15.3's `Consumer._drain_messages`:
    the loop is Faust's except for the `DeliveryOrder` verdict of each record of an acked
    topic, the gap Faust records on any jump of offsets (it includes the record being
    handed over, so a commit could pass it before it was handled), and the hand-over,
    awaited directly."""

    read_committed = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delivery_order: DeliveryOrder[TP] = DeliveryOrder()
        self._fetch_batch = 0
        self._pending_start: tuple[int, dict[Any, int]] | None = None

    @property
    def delivery_batch(self) -> int:
        """The fetch batch the delivery loop is handing over (or waiting for) now: every record
        of an earlier batch has been handed to the streams or the changelog queue
        (dlqapp.kafka.faust_recovery)."""
        return self._fetch_batch

    def on_buffer_drop(self, tp: Any) -> None:
        """Faust's flow control takes a partition out of the active ones while its stream's
        buffer is full, and puts it back here once the buffer drains; the poll waiting
        meanwhile (up to a second) would not see it back until it timed out. Measured while
        a flood of 20,000 requests was read: a 0.7-1 s stall each time a buffer filled, half
        the time it took to read the flood."""
        was_out = tp in self._buffered_partitions
        super().on_buffer_drop(tp)
        if was_out:
            self._wake_fetch()

    def resume_partitions(self, tps: Any) -> None:
        """Partitions active again (after a recovery): a waiting poll looks at them at once."""
        super().resume_partitions(tps)
        self._wake_fetch()

    def _wake_fetch(self) -> None:
        thread = getattr(self, "_thread", None)
        if isinstance(thread, FetchWaitConsumerThread):
            thread.wake_fetch()

    async def until_topics_known(self, every_s: float = 1.0, limit_s: float = 120.0) -> None:
        """After an assignment: while this consumer's metadata lacks a topic it subscribes to,
        refresh it every `every_s` (up to `limit_s`). A broker restarting can answer metadata
        without the topics for a moment; a group leader that assigns then leaves those topics'
        partitions to nobody (Faust's assignor: "Ignoring missing topic"), and aiokafka
        rejoins only once its metadata shows them, at its next refresh: 5 minutes later by
        default (a history: a worker started during a broker restart owned nothing for
        minutes). A refresh that shows them makes the leader rejoin at once."""
        deadline = monotonic() + limit_s
        logged = False
        while monotonic() < deadline:
            try:
                missing = await self._thread.call_thread(self._refresh_if_missing)
            except Exception as exc:  # stopping, or a newer rebalance: that one looks for itself
                _log.debug("topic metadata not checked: %r", exc)
                return
            if not missing:
                return
            if not logged:
                log_event(_log, logging.INFO, "topics_unknown_after_assignment", topics=len(missing), first=missing[0])
                logged = True
            await asyncio.sleep(every_s)

    async def _refresh_if_missing(self) -> list[str]:
        """The subscribed topics aiokafka's metadata does not know; a refresh asked if any."""
        consumer = self._thread._ensure_consumer()
        cluster = consumer._client.cluster
        missing = sorted(topic for topic in consumer.subscription() if not cluster.partitions_for_topic(topic))
        if missing:
            consumer._client.force_metadata_update()
        return missing

    async def on_partitions_revoked(self, revoked: set[Any]) -> None:
        self.delivery_order.forget(revoked)
        self._pending_start = None
        await super().on_partitions_revoked(revoked)

    async def perform_seek(self) -> None:
        """Seek every assigned partition to its committed offset, and have the acked ones
        deliver from there (from their first offset if none is committed yet) once Faust's
        flow control resumes (`_start_when_flowing`). A newer rebalance during the lookups
        makes this a no-op: it seeks for itself."""
        generation = self.app.consumer_generation_id
        committed = {ensure_TP(tp): offset for tp, offset in (await self.seek_to_committed()).items()}
        acked = [tp for tp in committed if self.app.topics.acks_enabled_for(tp.topic)]
        targets = {tp: committed[tp] for tp in acked if committed[tp] is not None and committed[tp] >= 0}
        missing = [tp for tp in acked if tp not in targets]
        if missing and generation == self.app.consumer_generation_id:
            firsts = await self._thread.call_thread(self._thread._ensure_consumer().beginning_offsets, missing)
            targets.update({ensure_TP(tp): offset for tp, offset in firsts.items()})
        if generation != self.app.consumer_generation_id:
            return
        for tp, offset in committed.items():  # Faust's own bookkeeping (Consumer.perform_seek)
            self._read_offset[tp] = offset if offset is not None and offset >= 0 else None
            if offset:
                self._committed_offset[tp] = offset
        self._pending_start = (generation, targets)
        await self._seek_all(targets)

    async def _start_when_flowing(self) -> None:
        """Start delivering the partitions the last seek named, once the app's flow control
        is active again and the rebalance has ended (its tables recovered). Faust resumes
        flow only after the seek, and until then its streams drop what they are handed: a
        record handed over earlier would count as delivered and never come again. Faust also
        resumes flow while it reads the changelogs, and a partition whose stream buffer was
        full before the rebalance is fetched again as soon as its buffer drains
        (`Consumer.on_buffer_drop` re-activates it, paused or not): started then, its events
        ran before their tables were recovered and again after the seek that ends the
        recovery (history seed 6012: one invalid record dead-lettered twice). The seek is
        repeated (what was fetched meanwhile was dropped)."""
        if self._pending_start is None or not self.app.flow_control.is_active() or self.app.rebalancing:
            return
        generation, targets = self._pending_start
        self._pending_start = None
        if generation != self.app.consumer_generation_id:
            return
        for tp, offset in targets.items():
            self.delivery_order.start(tp, offset, self._fetch_batch)
        await self._seek_all(targets)

    async def _seek_all(self, targets: Mapping[Any, int]) -> None:
        """Seek in the consumer's own thread (aiokafka is not thread-safe); a partition
        revoked meanwhile is left alone."""

        async def seek() -> None:
            consumer = self._thread._ensure_consumer()
            assigned = consumer.assignment()
            for tp, offset in targets.items():
                if tp in assigned:
                    consumer.seek(tp, offset)
            for tp, offset in targets.items():
                self._read_offset[ensure_TP(tp)] = offset or None

        await self._thread.call_thread(seek)

    async def _rewind_behind(self, batch: int) -> None:
        """While idle: rewind every partition whose fetch position passed records never
        delivered, or, when rewinds keep ending there, take the rest of its log as a gap."""
        positions = await self._thread.call_thread(self._positions)
        for tp, verdict, expected in self.delivery_order.idle_check(positions):
            now_expected = positions[tp] if verdict is Verdict.GAP else expected  # a gap moved it on
            if self.delivery_order.expected(tp) != now_expected:
                continue  # revoked (or sought again) while an earlier one was acted on
            if verdict is Verdict.GAP:
                await self._add_gap(tp, expected, positions[tp] - 1)
            else:
                await self._rewind(tp, positions[tp], batch, position=positions[tp])

    async def _rewind(self, tp: Any, offset: int, batch: int, **seen: int) -> None:
        """Seek `tp` back to the offset it should deliver next (`offset` showed it skipped records)."""
        expected = self.delivery_order.rewinding(tp, offset, batch)
        if expected is None:
            return  # revoked meanwhile: its next owner seeks for itself
        log_event(
            _log,
            logging.DEBUG if self.read_committed else logging.INFO,
            "delivery_rewound",
            topic=tp.topic,
            partition=tp.partition,
            expected=expected,
            **seen,
        )
        await self._seek_all({tp: expected})

    async def _positions(self) -> dict[TP, int]:
        """The fetch position of each assigned partition that has one (aiokafka's `SubscriptionState`)."""
        assignment = self._thread._ensure_consumer()._subscription.subscription
        assignment = assignment.assignment if assignment is not None else None
        if assignment is None:
            return {}
        positions: dict[TP, int] = {}
        for tp in assignment.tps:
            state = assignment.state_value(tp)
            if state is not None and state.has_valid_position:
                positions[ensure_TP(tp)] = state.position
        return positions

    async def _out_of_order(self, tp: Any, offset: int, batch: int, verdict: Verdict) -> bool:
        """Act on a record that is not the next expected; True when it is handed over anyway (a real gap)."""
        if verdict is Verdict.REWIND:
            await self._rewind(tp, offset, batch, fetched=offset)
        elif verdict is Verdict.GAP:
            expected = self.delivery_order.expected(tp)
            assert expected is not None  # `decide` finds a gap only where an offset is expected
            await self._add_gap(tp, expected, offset - 1)
        return verdict is Verdict.GAP

    async def _hand_over(self, tp: Any, message: Any) -> None:
        """Give `message` to the streams, and count it delivered unless a rebalance came between
        (or Faust's flow control was suspended: its streams drop what they get then).

        Awaited directly, not raced against `suspend_flow` as Faust does (four tasks a
        record): a stop cancels this loop, and a rebalance bumps the generation, which the
        streams and the check below both honour."""
        generation = self.app.consumer_generation_id
        flowing = self.app.flow_control.is_active()
        await self.callback(message)
        if flowing and generation == self.app.consumer_generation_id:  # else the stream drops it
            self.delivery_order.delivered(tp, message.offset)
            self._read_offset[tp] = message.offset

    async def _drain_messages(self, fetcher: Any) -> None:  # pragma: no cover - runs in every worker
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        acks_enabled_for = self.app.topics.acks_enabled_for
        order = self.delivery_order
        set_flag, unset_flag = self.diag.set_flag, self.diag.unset_flag
        since_yield = 0
        idle_checked = monotonic()
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                set_flag(CONSUMER_FETCHING)
                records = self.getmany(timeout=1.0)
                await self.sleep(0)  # getmany may return at once, again and again
                if self.should_stop:
                    continue
                self._fetch_batch += 1
                batch = self._fetch_batch
                await self._start_when_flowing()
                fetched = 0
                async for tp, message in records:
                    fetched += 1
                    since_yield += 1
                    if since_yield > 100:
                        await asyncio.sleep(0)
                        since_yield = 0
                    offset = message.offset
                    if acks_enabled_for(message.topic):
                        verdict = order.decide(tp, offset, batch)
                        if verdict is not Verdict.DELIVER and not await self._out_of_order(tp, offset, batch, verdict):
                            continue
                    if self._commit_every is not None and self._n_acked >= self._commit_every:
                        self._n_acked = 0
                        await self.commit()
                    await self._hand_over(tp, message)
                unset_flag(CONSUMER_FETCHING)
                if not fetched and monotonic() - idle_checked >= IDLE_CHECK_S:
                    idle_checked = monotonic()
                    await self._rewind_behind(batch)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                return
            raise
        finally:
            unset_flag(CONSUMER_FETCHING)
