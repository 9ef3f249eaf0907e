"""The real world of a worker: its producers, its backend, its hand-over client, the span
exporters, its share of the input partitions. Tests build `Ports` with fakes instead."""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaProducer
from faust.types import TP

from dlqapp.inference import create_backend
from dlqapp.kafka.faust_consumer_state import hand_back_unacked
from dlqapp.kafka.faust_producer import producer_send
from dlqapp.kafka.topic_consumer import TopicConsumer
from dlqapp.kafka.transactions import ProducerFactory
from dlqapp.retries.handover import HandOver
from dlqapp.settings import Settings
from dlqapp.tables.topology import Topology
from dlqapp.wiring.components import Ports
from dlqapp.wiring.faust_app import DlqApp


def ports_of(app: DlqApp, settings: Settings, topology: Topology) -> Ports:
    """The real world of a worker on `app`."""
    return Ports(
        send=producer_send(app),
        backend=create_backend(settings),
        handover=HandOver(settings.kafka_client(client_id="dlqapp-due-hop"), topology.due.get_topic_name()),
        input_share=lambda: input_share(app, settings),
        hand_back=lambda event: hand_back_unacked(app, event),
        new_producer=transactional_producer(settings) if settings.exactly_once else None,
        span_exporters=span_exporters(settings),
        tail_consumer=lambda: tail_consumer(settings),
        input_partitions=lambda: {tp.partition for tp in app.assignor.assigned_actives() if tp.topic == settings.input},
        input_ends=lambda partition: input_end(app, settings, partition),
    )


def tail_consumer(settings: Settings) -> TopicConsumer:
    """The consumer that reads the ends of `input` (dlqapp.kafka.tail_read): no group, assigned
    by hand; under exactly_once it reads committed records only, as the worker's own does."""
    return TopicConsumer(
        settings.input,
        **settings.kafka_client(
            client_id="dlqapp-tail-read",
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed" if settings.exactly_once else "read_uncommitted",
        ),
    )


def input_end(app: DlqApp, settings: Settings, partition: int) -> int | None:
    """The end of an `input` partition as the worker's consumer last heard (None: not yet)."""
    try:
        end = app.consumer.highwater(TP(settings.input, partition))
    except Exception:  # the consumer is not started, or the partition not fetched yet
        return None
    return end if isinstance(end, int) and end >= 0 else None


def span_exporters(settings: Settings) -> tuple[Any, ...]:
    """The span exporters OTEL_TRACES_EXPORTER names (none when tracing is off), each built as the
    OpenTelemetry SDK builds it: with no arguments, reading its own OTEL_EXPORTER_* variables."""
    if not settings.span_exporters:
        return ()
    from dlqapp.observability.otel import load_exporters  # the SDK is loaded only when tracing is on

    return load_exporters(settings.span_exporters)


def transactional_producer(settings: Settings) -> ProducerFactory:
    """aiokafka's transactional producer for one owned partition number (dlqapp.kafka.transactions)."""

    def new(transactional_id: str) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            **settings.kafka_client(
                client_id=transactional_id,
                transactional_id=transactional_id,
                enable_idempotence=True,
                acks="all",
                transaction_timeout_ms=settings.transaction_timeout_ms,
                max_request_size=settings.producer_request_bytes,
                # nothing of an open transaction is read before its commit, which sends what lingers
                linger_ms=max(settings.producer_linger_ms, settings.commit_interval_ms),
            )
        )

    return new


def input_share(app: DlqApp, settings: Settings) -> float:
    """The fraction of the input partitions this worker owns now (its share of the rate limits)."""
    owned = sum(1 for tp in app.assignor.assigned_actives() if tp.topic == settings.input)
    return owned / settings.partitions
