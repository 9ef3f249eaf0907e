"""The Faust producer, transport and reply internals dlqapp relies on.

Each helper names the private member it touches and why. Checked against faust-streaming
0.15.3; read these first after an upgrade. Installed by the Faust app's hooks
(dlqapp.wiring.faust_app): `_settings_extra` of the aiokafka producer (idempotence),
`App.on_started` (`keep_in_metadata`), `App._new_producer`, `App._new_transport` and
`_new_producer_transport` (`PatientTransport`), `App._reply_consumer`
(`SingleChannelReplyConsumer`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from aiokafka.errors import KafkaError
from faust.agents.replies import ReplyConsumer, ReqRepResponse
from faust.models import maybe_model
from faust.transport.drivers.aiokafka import Producer as AIOKafkaProducer
from faust.transport.drivers.aiokafka import Transport as AIOKafkaTransport

from dlqapp.kafka.admin import retry_while_transient
from dlqapp.observability.logs import log_event

_log = logging.getLogger("dlqapp.kafka.delivery")


class PatientTransport(AIOKafkaTransport):
    """Faust's aiokafka transport, whose topic creation is retried while a broker is down.

    At start Faust declares every topic it uses (`Topic.maybe_declare`): it asks the first
    broker the client knows for the controller, then sends it the creation. A worker started
    while that broker is down (killed, not yet fenced by the controller) crashed there with
    `NodeNotReadyError`. Retried like dlqapp's own topic checks (`dlqapp.kafka.admin.retry_while_transient`),
    with fresh metadata each time: once the dead broker is fenced it is no longer listed.
    """

    async def _create_topic(
        self, owner: Any, client: Any, topic: str, partitions: int, replication: int, **kwargs: Any
    ) -> None:
        def retrying(exc: KafkaError) -> None:
            log_event(_log, logging.WARNING, "topic_declare_retry", topic=topic, error=repr(exc))
            client.force_metadata_update()

        create = super()._create_topic
        await retry_while_transient(lambda: create(owner, client, topic, partitions, replication, **kwargs), retrying)


class SingleChannelReplyConsumer(ReplyConsumer):
    """Faust's consumer of `Agent.ask()` replies, each reply delivered once and never waited on.

    Faust 0.15.3's `ReplyConsumer._start_fetcher` subscribes the reply topic twice: it adds
    the topic to the conductor (`app.topics.add`), then iterates a stream over it, which
    adds a clone. Every reply went to both queues and only the stream's was read, so each
    reply stayed unacked for good: the first rebalance or shutdown after an operator action
    through a worker that does not own the request waited for it in `Consumer.wait_empty()`
    forever (a SIGTERM ended in a kill), and once the unread queue was full the conductor
    blocked, stopping the worker's every agent. Here the stream reads the one channel
    subscribed, and the reply topic is not acked: a lost reply only makes its `ask()` time
    out (dlqapp answers 'error').
    """

    async def _start_fetcher(self, topic_name: str) -> None:
        if topic_name not in self._fetchers:
            self._fetchers[topic_name] = None  # the key is the lock, as in Faust
            topic = self._reply_topic(topic_name)
            await topic.maybe_declare()
            channel = topic.clone(is_iterator=True)  # the one channel, subscribed at once as before
            self.app.topics.add(channel)
            # Faust's pause, kept (the worker's start-up waits here). Without it, 2 of 3 full
            # CI runs had a worker whose first group join did not see a changelog created
            # just before ("Ignoring missing topic"), and that table's writes then failed
            # with PartitionsMismatch; no such failure in any run with Faust's timing.
            await self.sleep(3.0)
            self._fetchers[topic_name] = self.add_future(self._drain_replies(channel))

    async def _drain_replies(self, channel: Any) -> None:
        """Faust's loop (`ReplyConsumer._drain_replies`), except that a second answer to an
        `ask()` already answered is dropped: Faust's `set_result` on a done promise raised
        InvalidStateError and crashed the worker (a command answered, then delivered again
        after a rebalance or a kill and answered again)."""
        async for reply in channel.stream():
            for promise in list(self._waiting.get(reply.correlation_id, ())):
                if not promise.done():
                    promise.fulfill(reply.correlation_id, maybe_model(reply.value))

    def _reply_topic(self, topic: str) -> Any:
        return self.app.topic(
            topic,
            partitions=1,
            replicas=self.app.conf.topic_replication_factor,
            deleting=True,
            retention=self.app.conf.reply_expires,
            value_type=ReqRepResponse,
            acks=False,
        )


def keep_in_metadata(client: Any, topics: Iterable[str]) -> None:
    """Have every metadata refresh of an aiokafka `client` include `topics` (`add_topic`).

    aiokafka replaces the client's topic metadata with each refresh's answer, and a refresh
    asks for the topics the client was told of (`add_topic`, on a send to a topic it does
    not know), or for all topics while it was told of none. Faust's producer starts with a
    full refresh, so it is told of none of the topics it then writes to. Its first send to a
    topic created since (another worker's `ask()` reply topic) made the next refresh ask
    for that topic alone, and every other one dropped out of the metadata: batches already
    queued for them had no leader until `request_timeout_ms` (Faust: 20 min), so a handler
    waited that long for its result to be written, and lookups by key failed.
    Only topics the client knows now are added: one that does not exist yet would make
    every refresh log an error for it. dlqapp calls this once the worker has started, when
    Faust has declared its changelog and reply topics (`DlqApp.on_started`).
    """
    for topic in topics:
        if client.cluster.partitions_for_topic(topic) is not None:
            client.add_topic(topic)


def producer_client(producer: Any) -> Any:
    """The aiokafka client of Faust's producer (`Producer._producer`), None until it has started."""
    aiokafka_producer = getattr(producer, "_producer", None)
    return aiokafka_producer.client if aiokafka_producer is not None else None


def widen_changelog_buffer(producer: Any, max_messages: int) -> None:
    """Let Faust's producer buffer hold `max_messages` table writes before it stops the consumer.

    Faust queues each table write in `Producer.buffer` and, once more than
    `ProducerBuffer.max_messages` (100) wait, stops handing records of every topic to
    the agents until 100 are sent (`Conductor.on_message` -> `wait_until_ebb`). A burst of
    300 retries (five or so writes each) held due retries back that way 0.1-0.35 s at a time,
    with a WARNING each time. dlqapp's handlers already wait for their own writes
    (dlqapp.tables.durability), so the writes pending are bounded by the handlers in flight.
    """
    producer.buffer.max_messages = max_messages


def producer_send(app: Any) -> Any:
    """`send(topic, key, value, partition, headers)` on Faust's producer (`Producer.send`), for
    records dlqapp encodes itself: what `Topic.send` does, without its futures, channel and sensors."""

    async def send(
        topic: str, key: bytes, value: bytes | None, partition: int, headers: list[tuple[str, bytes]]
    ) -> Any:
        return await app.producer.send(topic, key, value, partition, None, headers)

    return send


class IdempotentProducer(AIOKafkaProducer):
    """Faust's producer with acks=all and idempotence, so retried sends never duplicate."""

    def _settings_extra(self) -> dict:
        return {**super()._settings_extra(), "acks": "all", "enable_idempotence": True}
