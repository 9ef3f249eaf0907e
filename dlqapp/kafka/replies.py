"""Answers to `Agent.ask()`, and this worker's reply topic, deleted when the worker stops.

Faust gives each worker process a reply topic of its own, `<app id>-reply-<uuid>`, where
its `ask()`s are answered (an operator's command asked on one worker runs on the worker
owning the request). Left there, every start left one more topic on the cluster; dlqapp
deletes it when the worker stops (`delete_reply_topic`). An answer may then find its topic
gone (the asker stopped after asking), so `Replies` sends an answer to another worker:

- only if its topic exists, asked without creating it (a cluster with
  `auto.create.topics.enable` would bring a deleted reply topic back);
- with a producer of its own, not idempotent, whose sends expire after ANSWER_WITHIN_S:
  an answer stuck on a topic deleted meanwhile would hold Faust's producer, whose flush a
  stop waits for (an idempotent producer retries it for good, Faust's for 20 minutes);
- and then leaves the topic out of that producer's metadata topics: aiokafka refreshes
  every topic it was told of, and one deleted since would be logged as an ERROR at every
  refresh, or created again.

An answer to this worker's own topic (an action asked and owned here) goes with Faust's
producer, as Faust's `Agent._reply` sends it. A worker killed (`kill -9`) leaves its reply
topic behind: it holds only answers, which expire after Faust's `reply_expires`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, UnknownTopicOrPartitionError, for_code
from aiokafka.protocol.metadata import MetadataRequest
from faust.exceptions import ProducerSendError
from mode import Service

from dlqapp.kafka.access import KafkaAccessError
from dlqapp.kafka.acls import reply_prefix
from dlqapp.kafka.admin import connect_admin
from dlqapp.kafka.faust_agents import reply_record, reply_target
from dlqapp.observability.logs import log_event
from dlqapp.settings import Settings

_log = logging.getLogger("dlqapp.kafka.replies")

ANSWER_WITHIN_S = 5.0
"""How long an answer to another worker may take to find its topic and be written there."""
DELETE_WITHIN_S = 2.0
"""How long a stopping worker tries to delete its reply topic (a few milliseconds when the
broker is there; the stop as a whole has DLQ_DRAIN_TIMEOUT plus 4 s)."""


def answers_producer(client_options: dict[str, Any]) -> Callable[[], AIOKafkaProducer]:
    """Makes the producer of answers to other workers (module doc)."""
    timeout_ms = int(ANSWER_WITHIN_S * 1000)
    return lambda: AIOKafkaProducer(
        **client_options, enable_idempotence=False, acks=1, linger_ms=0, request_timeout_ms=timeout_ms
    )


class Replies(Service):
    """Sends the operator agent's answers (`answer`); its producer stops with the worker."""

    def __init__(self, app: Any, new_producer: Callable[[], Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.app = app
        self._new_producer = new_producer
        self._producer: Any = None
        self._abandoned: asyncio.Future[Any] | None = None

    async def answer(self, agent: Any, event: Any, answer: Any) -> bool:
        """Send `answer` to whoever asked `event`; False when nobody did or it was dropped."""
        target = reply_target(event)
        if target is None:
            return False
        record = reply_record(agent, event, answer, target)
        try:
            if target.topic == self.app.conf.reply_to:
                await self.app.send(target.topic, key=None, value=record)
                return True
            return await self._answer_another(target.topic, record)
        except (KafkaError, ProducerSendError) as exc:
            log_event(_log, logging.WARNING, "answer_dropped", reply_to=target.topic, error=repr(exc))
            return False

    async def _answer_another(self, topic: str, record: Any) -> bool:
        try:
            delivered = await asyncio.wait_for(self._send_if_there(topic, record), ANSWER_WITHIN_S)
            if delivered is None:
                log_event(_log, logging.INFO, "answer_dropped", reply_to=topic, reason="the asker has stopped")
                return False
            await delivered  # never cancelled: it ends by ANSWER_WITHIN_S, and nothing is left queued
            return True
        except TimeoutError as exc:
            log_event(_log, logging.WARNING, "answer_dropped", reply_to=topic, error=repr(exc))
            return False
        finally:
            if self._producer is not None:
                forget_topic(self._producer.client, topic)

    async def _send_if_there(self, topic: str, record: Any) -> asyncio.Future[Any] | None:
        if self._producer is None:
            producer = self._new_producer()
            try:
                await producer.start()
            except BaseException:  # a broker away, or the answer's time is up: close what it opened
                self._abandoned = asyncio.ensure_future(producer.stop())
                raise
            self._producer = producer
        if not await topic_exists(self._producer.client, topic):
            return None
        return await self._producer.send(topic, record.dumps(serializer="json"))

    async def on_stop(self) -> None:
        if self._producer is not None:
            with contextlib.suppress(Exception):  # a broker away: the worker is stopping anyway
                await asyncio.wait_for(self._producer.stop(), ANSWER_WITHIN_S)


async def topic_exists(client: Any, topic: str) -> bool:
    """Whether `topic` exists, asked of one broker without creating it: aiokafka's own
    metadata requests allow auto-creation, which on a cluster with
    `auto.create.topics.enable` would create a topic deleted on purpose."""
    request = MetadataRequest([topic], allow_auto_topic_creation=False)
    response = await client.send(client.get_random_node(), request)
    return any(t["topic"] == topic and t["error_code"] == 0 for t in response.to_object()["topics"])


def forget_topic(client: Any, topic: str) -> None:
    """Leave `topic` out of an aiokafka `client`'s metadata refreshes (the opposite of
    `add_topic`, which a send to a topic it does not know calls). aiokafka has no public
    reader of the topics it tracks (`AIOKafkaClient._topics`); `set_topics` with fewer
    topics only replaces the set, with no refresh (with none, refreshes ask for all)."""
    tracked = client._topics
    if topic in tracked:
        client.set_topics(tracked - {topic})


async def delete_reply_topic(settings: Settings, topic: str) -> bool:
    """Delete this worker's reply topic (a clean stop) within DELETE_WITHIN_S; True when it is
    gone. A refusal (no Delete ACL) or a broker away leaves it, said in one WARNING line."""
    try:
        error_code = await asyncio.wait_for(_delete(settings, topic), DELETE_WITHIN_S)
    except (TimeoutError, KafkaError, KafkaAccessError, OSError) as exc:
        error = repr(exc)
    else:
        if error_code in (0, UnknownTopicOrPartitionError.errno):
            return True
        error = for_code(error_code).__name__
    log_event(
        _log,
        logging.WARNING,
        "reply_topic_left",
        topic=topic,
        error=error,
        fix=f"allow Delete on topics prefixed {reply_prefix(settings)} (faust -A dlqapp acls), or delete it",
    )
    return False


async def _delete(settings: Settings, topic: str) -> int:
    admin = await connect_admin(settings)
    try:
        response = await admin.delete_topics([topic], timeout_ms=int(DELETE_WITHIN_S * 1000))
        codes = {t["topic"]: t["error_code"] for t in response.to_object()["topic_error_codes"]}
        return codes.get(topic, 0)
    finally:
        await admin.close()
