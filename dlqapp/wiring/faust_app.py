"""The Faust app: built from settings, and little else.

Agents, tables, views and commands live in their own modules and register on `app`.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, Protocol, cast

import faust
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.types import ServiceT
from faust.web import drivers as web_drivers
from faust.web.drivers.aiohttp import Web as AiohttpWeb
from mode.utils.objects import cached_property
from yarl import URL

from dlqapp.api.auth import access_policy, guard_middleware
from dlqapp.api.http import SurrogateSafeWeb
from dlqapp.kafka.access import KafkaAccessError
from dlqapp.kafka.acls import reply_prefix
from dlqapp.kafka.admin import ensure_topics
from dlqapp.kafka.faust_consumer import dlq_consumer_class
from dlqapp.kafka.faust_producer import (
    IdempotentProducer,
    PatientTransport,
    SingleChannelReplyConsumer,
    keep_in_metadata,
    producer_client,
    widen_changelog_buffer,
)
from dlqapp.kafka.faust_recovery import end_recoveries
from dlqapp.kafka.reached import mark_reached, reached_before
from dlqapp.kafka.replies import delete_reply_topic
from dlqapp.kafka.topic_checks import TopicMismatchError
from dlqapp.kafka.transactions import Transactions
from dlqapp.observability.logs import apply_log_format, configure_logging, log_event
from dlqapp.settings import Settings
from dlqapp.tables.durability import ConfirmedTable
from dlqapp.tables.steps import StreamSteps
from dlqapp.wiring.faust_topics import internal_topics, written_topics
from dlqapp.wiring.process import tune_garbage_collector, wipe_local_tables
from dlqapp.wiring.restart import Restarts, StopWatch
from dlqapp.wiring.worker import DlqWorker

log = logging.getLogger(__name__)

PRODUCER_BUFFER_MESSAGES = 10_000
"""Table writes Faust's producer may queue before it stops feeding the agents. The windows
bound the handlers in flight and each waits for its writes, so this is only a memory cap."""


class Lifecycle(Protocol):
    """What the worker does at start and when it gives work back (dlqapp.wiring.agents)."""

    def started(self) -> None: ...

    async def release(self, reopen: bool) -> None: ...

    def revoked(self) -> None: ...

    def assigned(self) -> None: ...

    def halt(self) -> None: ...


class DlqApp(faust.App):
    """A Faust app that ensures its topics before consuming, produces idempotently, and
    hands unfinished work back on shutdown and rebalances (its `lifecycle`)."""

    dlq_settings: Settings
    restarts: Restarts
    """Whether and when this worker restarts itself (dlqapp.wiring.restart)."""
    stop_watch: StopWatch
    lifecycle: Lifecycle | None = None
    steps: StreamSteps | None = None
    """The worker's stream steps and, under exactly_once, its partitions' transactions."""
    _recovery_start: tuple[float, dict[Any, int]] | None = None
    _ready_logged = False
    topics_checked = False
    """True once this run's topic checks passed (on_first_start)."""

    def _new_web(self) -> Any:
        """Faust's web driver, with JSON answers that survive a lone surrogate (SurrogateSafeWeb)."""
        if web_drivers.by_url(self.conf.web) is AiohttpWeb:
            return SurrogateSafeWeb(self)
        return super()._new_web()

    def stop_requested(self) -> None:
        """SIGTERM or Ctrl-C (dlqapp.wiring.worker): never restart from now on, and be gone in bounded time."""
        self.restarts.request_stop()
        self.stop_watch.start()

    def fail(self, reason: BaseException) -> None:
        """Stop as Faust stops on an agent crash (`Service._crash`), events unacked, and start
        no step (`Lifecycle.halt`): a call now would be for an output that never commits."""
        if self.lifecycle is not None:
            self.lifecycle.halt()
        self._crash(reason)

    def attach(self, lifecycle: Lifecycle, steps: StreamSteps) -> None:
        """Called once by the composition root."""
        self.lifecycle = lifecycle
        self.steps = steps

    def add_service(self, service: ServiceT) -> None:
        """Start `service` with the app. Faust's `service()` takes an instance as well as a
        class (`on_init_extra_service`), but declares only a class."""
        self.service(service)  # type: ignore[arg-type]

    @property
    def table_recovery(self) -> Recovery:
        """The tables' changelog recovery: `App.tables` is a `TableManager`, which Faust
        types as `TableManagerT`, an interface without `recovery`."""
        return cast(TableManager, self.tables).recovery

    async def on_first_start(self) -> None:
        wipe_local_tables(self.dlq_settings, self.conf.tabledir)
        await super().on_first_start()
        if self.dlq_settings.exactly_once:
            self.add_future(end_recoveries(self))  # faust_recovery: changelogs end in commit markers
        apply_log_format(self.dlq_settings)
        if self.lifecycle is not None:
            self.lifecycle.started()
        started = time.monotonic()
        internal = internal_topics(self)
        security = self.dlq_settings.kafka_security
        if security.uses_tls and not security.check_hostname:
            log_event(
                log,
                logging.WARNING,
                "kafka_hostname_unchecked",
                setting="DLQ_KAFKA_SSL_CHECK_HOSTNAME=false",
                risk="any certificate the CA signed is accepted for any broker",
            )
        try:
            # settings that got through before (in place or in an earlier process): a listener
            # closing connections at once is a broker away, not a misconfiguration
            worked_before = self.restarts.in_a_row > 0 or reached_before(self.dlq_settings)
            created = await ensure_topics(self.dlq_settings, internal, worked_before=worked_before)
        except (TopicMismatchError, KafkaAccessError) as exc:
            log.critical("refusing to start: %s", exc)
            print(f"dlqapp: refusing to start: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(3) from None
        self.topics_checked = True
        mark_reached(self.dlq_settings)
        checked = len(self.dlq_settings.all_topics()) + len(internal)
        log_event(
            log,
            logging.INFO,
            "topics_ready",
            checked=checked,
            created=len(created),
            seconds=round(time.monotonic() - started, 2),
            kafka=self.dlq_settings.kafka_security.describe(),
        )

    async def on_started(self) -> None:
        await super().on_started()
        tune_garbage_collector()
        # Every topic exists now (Faust declared its changelogs and reply topic at start):
        # faust_producer.keep_in_metadata.
        client = producer_client(self.producer)
        if client is not None:
            keep_in_metadata(client, written_topics(self))

    async def on_stop(self) -> None:
        # Before Faust's consumer waits for every event to be acked: events held by the
        # breaker never would be, so they are handed back unacked first (Ctrl-C, SIGTERM).
        if self.lifecycle is not None:
            await self.lifecycle.release(reopen=False)
        await self._close_transactions(self.transaction_partitions())
        await super().on_stop()

    async def on_shutdown(self) -> None:
        # Everything has stopped, the consumer of the reply topic too: a new one each start
        # (dlqapp.kafka.replies).
        await super().on_shutdown()
        if self.topics_checked:
            await delete_reply_topic(self.dlq_settings, self.conf.reply_to)

    async def _on_partitions_revoked(self, revoked: set) -> None:
        # Same for a rebalance (Faust's hook waits for acks, then commits): bounded by
        # DLQ_DRAIN_TIMEOUT, so held work never outlasts the rebalance timeout.
        # (faust_consumer: this private hook is the only one that runs before the wait.)
        if not self.should_stop and self.lifecycle is not None:
            await self.lifecycle.release(reopen=True)
        await self._close_transactions(self.transaction_partitions())  # sealed with their counts
        if not self.should_stop and self.lifecycle is not None:
            self.lifecycle.revoked()
        await super()._on_partitions_revoked(revoked)

    async def _on_partitions_assigned(self, assigned: set, generation_id: int = 0) -> None:
        # The windows a revocation closed take events again: from here on they belong to
        # this assignment (dlqapp's consumer delivers a partition only after its seek).
        if not self.should_stop and self.lifecycle is not None:
            self.lifecycle.assigned()
        await self._open_transactions({tp.partition for tp in assigned if tp.topic == self.dlq_settings.input})
        await super()._on_partitions_assigned(assigned, generation_id)
        self.add_future(self.consumer.until_topics_known())  # type: ignore[attr-defined]  # faust_consumer
        owned = sorted({tp.partition for tp in assigned if tp.topic == self.dlq_settings.input})
        log_event(
            log,
            logging.INFO,
            "partitions_assigned",
            generation=generation_id,
            partitions=len(owned),
            of=self.dlq_settings.partitions,
        )
        recovery = self.table_recovery
        self._recovery_start = (
            time.monotonic(),
            {tp: -1 if offset is None else offset for tp, offset in recovery.active_offsets.items()},
        )

    def _transactions(self) -> Transactions | None:
        return None if self.steps is None else self.steps.transactions

    def transaction_partitions(self) -> set[int]:
        transactions = self._transactions()
        return set(transactions.partitions) if transactions is not None else set()

    async def _open_transactions(self, partitions: set[int]) -> None:
        """Under exactly_once: fence the previous owners of newly owned partition numbers
        before their changelogs are read (Faust's recovery starts in `super()`)."""
        transactions = self._transactions()
        if transactions is None or not partitions:
            return
        try:
            await transactions.assign(partitions)
        except Exception as exc:
            fail_transactions(self, exc)
            raise

    async def _close_transactions(self, partitions: set[int]) -> None:
        """Under exactly_once: seal, commit and close the transactions of partitions handed back."""
        if self.steps is None or self._transactions() is None or not partitions:
            return
        try:
            await self.steps.revoke(partitions)
        except Exception as exc:
            fail_transactions(self, exc)

    def on_rebalance_end(self) -> None:
        super().on_rebalance_end()
        if self._recovery_start is None:
            return
        began, offsets = self._recovery_start
        self._recovery_start = None
        records = sum(max(0, high - offsets.get(tp, -1)) for tp, high in self.table_recovery.active_highwaters.items())
        log_event(log, logging.INFO, "tables_recovered", records=records, seconds=round(time.monotonic() - began, 2))
        if not self._ready_logged:
            self._ready_logged = True
            self.restarts.ready()
            log_event(log, logging.INFO, "ready", console=f"{self.conf.canonical_url}/ui/".replace("//ui", "/ui"))

    def _new_transport(self) -> Any:
        # faust_producer: Faust's topic declarations, retried while a broker is down.
        return PatientTransport(self.conf.broker_consumer, self)

    def _new_producer_transport(self) -> Any:
        return PatientTransport(self.conf.broker_producer, self)

    def _new_consumer(self) -> Any:
        # faust_consumer: the fetch wait Faust fixes at 1.5 s, due hints first, records in offset order;
        # see dlq_consumer_class.
        settings = self.dlq_settings
        consumer_class = dlq_consumer_class(
            settings.fetch_max_wait_ms, frozenset({settings.due}), read_committed=settings.exactly_once
        )
        return consumer_class(
            self.transport,
            callback=self.topics.on_message,
            loop=self.loop,
            on_partitions_revoked=self._on_partitions_revoked,
            on_partitions_assigned=self._on_partitions_assigned,
            beacon=self.beacon,
        )

    @cached_property
    def _reply_consumer(self) -> SingleChannelReplyConsumer:
        # faust_producer: Faust's reply consumer subscribes its topic twice; see SingleChannelReplyConsumer.
        return SingleChannelReplyConsumer(self, loop=self.loop, beacon=self.beacon)

    def _new_producer(self) -> IdempotentProducer:
        # faust_producer: Faust has no setting for producer idempotence ports exactly-once.
        producer = IdempotentProducer(self.transport, loop=self.loop, beacon=self.beacon)
        widen_changelog_buffer(producer, PRODUCER_BUFFER_MESSAGES)
        return producer


def fail_transactions(app: Any, exc: BaseException) -> None:
    """A partition's transaction could not commit: its steps' outputs never became visible
    and their events stay unacked, but the local tables hold their writes, so the worker
    restarts itself and rebuilds them from the changelogs (dlqapp.wiring.restart)."""
    app.restarts.restart_after_stop(app, exc, ready=bool(getattr(app, "_ready_logged", False)))


def create_app(settings: Settings) -> DlqApp:
    """A configured, not yet started, dlqapp Faust app."""
    configure_logging(settings)
    brokers = ";".join(settings.kafka_bootstrap.split(","))
    app = DlqApp(
        settings.app_id,
        broker=f"kafka://{brokers}",
        store="rocksdb://",
        datadir=settings.data_dir,
        autodiscover=False,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        broker_session_timeout=settings.session_timeout_ms / 1000,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_ms / 3000),
        broker_max_poll_records=settings.max_poll_records,
        producer_acks=-1,
        producer_linger=settings.producer_linger_ms / 1000,
        producer_max_request_size=settings.producer_request_bytes,
        consumer_max_fetch_size=max(4 * 1024 * 1024, settings.table_record_bytes),
        web_bind=settings.web_host,
        web_host=settings.web_host,
        web_port=settings.web_port,
        broker_credentials=settings.kafka_security.faust_credentials(),
        web_tables_enabled=False,
        web_application_options={
            "client_max_size": settings.max_body_bytes,
            "middlewares": [guard_middleware(access_policy(settings))],
        },
        reply_create_topic=True,
        reply_to_prefix=reply_prefix(settings),
        stream_wait_empty=True,
        table_standby_replicas=1,
        Table=ConfirmedTable,
        Worker=DlqWorker,
    )
    if settings.web_advertised_url:
        app.conf.canonical_url = URL(settings.web_advertised_url)
    app.dlq_settings = settings
    app.restarts = Restarts()
    app.stop_watch = StopWatch(settings.drain_timeout_ms / 1000)
    return app
