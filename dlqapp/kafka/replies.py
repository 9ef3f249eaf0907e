"""Answers to `Agent.ask()`, and this worker's reply topic, deleted when the worker stops.

Faust gives each worker process a reply topic of its own, `<app id>-reply-<uuid>`, where
its `ask()`s are answered (an operator's command asked on one worker runs on the worker
owning the request). Left there, every start left one more topic on the cluster; dlqapp
deletes it when the worker stops (`delete_reply_topic`). An answer may then find its topic
gone (the asker stopped after asking), so an answer (`Replies.answer`):

- goes out only if its topic exists, asked without creating it (a cluster with
  `auto.create.topics.enable` would bring a deleted reply topic back), and is written
  within ANSWER_WITHIN_S, or dropped: the `ask()` it answers has ended on the asker's side;
- leaves another worker's reply topic out of the producer's metadata topics once sent:
  aiokafka refreshes every topic it was told of, and one deleted since would be logged as
  an ERROR at every refresh, or created again.

A worker killed (`kill -9`) leaves its reply topic behind: it holds only answers, which
expire after Faust's `reply_expires`, and can be deleted.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka.errors import KafkaError, for_code

from dlqapp.kafka.access import KafkaAccessError
from dlqapp.kafka.acls import reply_prefix
from dlqapp.kafka.admin import connect_admin
from dlqapp.kafka.faust_agents import ReplyTarget, reply_record, reply_target
from dlqapp.kafka.faust_producer import forget_topic, producer_client, topic_exists
from dlqapp.observability.logs import log_event
from dlqapp.settings import Settings

_log = logging.getLogger("dlqapp.kafka.replies")

ANSWER_WITHIN_S = 5.0
"""How long an answer may take to be found a topic and written there before it is dropped."""
DELETE_WITHIN_S = 2.0
"""How long a stopping worker tries to delete its reply topic (a few milliseconds when the
broker is there; the stop as a whole has DLQ_DRAIN_TIMEOUT plus 4 s)."""
UNKNOWN_TOPIC = 3


class Replies:
    """Sends the operator agent's answers (`answer`) with Faust's producer."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def answer(self, agent: Any, event: Any, answer: Any) -> bool:
        """Send `answer` to whoever asked `event`; False when nobody did or it was dropped."""
        target = reply_target(event)
        if target is None:
            return False
        own = target.topic == self.app.conf.reply_to
        client = producer_client(self.app.producer)
        try:
            return await asyncio.wait_for(self._send(agent, event, answer, target, client, own), ANSWER_WITHIN_S)
        except (TimeoutError, KafkaError) as exc:
            log_event(_log, logging.WARNING, "answer_dropped", reply_to=target.topic, error=repr(exc))
            return False
        finally:
            if not own and client is not None:
                forget_topic(client, target.topic)

    async def _send(self, agent: Any, event: Any, answer: Any, target: ReplyTarget, client: Any, own: bool) -> bool:
        if not own and client is not None and not await topic_exists(client, target.topic):
            log_event(_log, logging.INFO, "answer_dropped", reply_to=target.topic, reason="the asker has stopped")
            return False
        delivered = await self.app.send(target.topic, key=None, value=reply_record(agent, event, answer, target))
        await delivered
        return True


async def delete_reply_topic(settings: Settings, topic: str) -> bool:
    """Delete this worker's reply topic (a clean stop) within DELETE_WITHIN_S; True when it is
    gone. A refusal (no Delete ACL) or a broker away leaves it, said in one WARNING line."""
    try:
        error_code = await asyncio.wait_for(_delete(settings, topic), DELETE_WITHIN_S)
    except (TimeoutError, KafkaError, KafkaAccessError, OSError) as exc:
        error = repr(exc)
    else:
        if error_code in (0, UNKNOWN_TOPIC):
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
