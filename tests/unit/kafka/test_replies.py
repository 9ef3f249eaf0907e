"""Answers to `ask()`: to another worker only while its reply topic exists, with a producer of
their own, bounded, and the topic then left out of that producer's metadata topics; to this
worker's own topic with Faust's producer."""

import asyncio
import logging
from types import SimpleNamespace

from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError
from faust.agents.models import ReqRepRequest

from dlqapp.kafka import replies
from dlqapp.kafka.replies import Replies

OWN = "dlqapp-reply-own"
PEER = "dlqapp-reply-peer"


class FakeClient:
    """aiokafka's client as far as answers go: the topics it tracks and one broker's metadata."""

    def __init__(self, existing: set[str], answers: bool) -> None:
        self.existing = existing
        self.answers = answers
        self._topics: set[str] = set()
        self.metadata_requests: list = []

    def get_random_node(self) -> int:
        return 1

    async def send(self, node_id: int, request) -> SimpleNamespace:
        self.metadata_requests.append(request)
        if not self.answers:
            await asyncio.Event().wait()  # a broker that never answers
        topics = [{"topic": t, "error_code": 0 if t in self.existing else 3} for t in request._topics]
        return SimpleNamespace(to_object=lambda: {"topics": topics})

    def set_topics(self, topics) -> None:
        self._topics = set(topics)


class FakeProducer:
    """The answers producer: what it sent, and whether a send is ever delivered."""

    def __init__(self, client: FakeClient, delivery: str) -> None:
        self.client = client
        self.delivery = delivery
        self.sent: list[tuple[str, bytes]] = []
        self.started = self.stopped = False

    async def start(self) -> None:
        if self.delivery == "no broker":
            raise KafkaConnectionError("Unable to bootstrap")
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def send(self, topic: str, value: bytes) -> asyncio.Future:
        self.client._topics.add(topic)  # what aiokafka's send does for a topic it did not know
        self.sent.append((topic, value))
        delivery: asyncio.Future = asyncio.get_running_loop().create_future()
        if self.delivery == "ok":
            delivery.set_result("metadata")
        else:  # the producer's own request timeout, as aiokafka's expiry of the batch
            delivery.set_exception(KafkaTimeoutError())
        return delivery


class FakeApp:
    """Faust's app as far as answers go: its reply topic and `send` (Faust's producer)."""

    def __init__(self) -> None:
        self.conf = SimpleNamespace(reply_to=OWN)
        self.sent: list[tuple[str, object]] = []

    async def send(self, topic: str, key=None, value=None) -> asyncio.Future:
        self.sent.append((topic, value))
        return asyncio.get_running_loop().create_future()  # Faust does not wait for delivery


class FakeAgent:
    def _response_class(self, value):
        return replies_record


def replies_record(**fields):
    return SimpleNamespace(**fields, dumps=lambda serializer: f"{fields['correlation_id']}:{serializer}".encode())


def asked(reply_to: str) -> SimpleNamespace:
    request = ReqRepRequest(value={"action": "replay"}, reply_to=reply_to, correlation_id="c-1")
    return SimpleNamespace(key=b"r-1", value=request, headers={})


def answer(event, existing=frozenset({PEER}), delivery="ok", broker_answers=True):
    """(answered, the app, the answers producer) after one answer to `event`, and the stop."""
    app = FakeApp()
    producer = FakeProducer(FakeClient(set(existing), broker_answers), delivery)

    async def go() -> bool:
        service = Replies(app, lambda: producer)
        answered = await service.answer(FakeAgent(), event, {"status": "reprocessed"})
        await service.on_stop()
        return answered

    return asyncio.run(go()), app, producer


def test_an_answer_to_another_workers_topic_goes_once_the_topic_is_found_and_is_then_not_tracked():
    answered, app, producer = answer(asked(PEER))
    assert answered is True and app.sent == []  # not with Faust's producer
    assert producer.sent == [(PEER, b"c-1:json")]
    (request,) = producer.client.metadata_requests
    wire = request.prepare({3: (4, 12)})  # as a Kafka 4 broker's versions have it built
    assert list(wire.topics) == [PEER] and wire.allow_auto_topic_creation is False
    assert PEER not in producer.client._topics and producer.stopped


def test_an_answer_whose_asker_has_stopped_is_dropped_without_a_send_and_said(caplog):
    with caplog.at_level(logging.INFO, "dlqapp.kafka.replies"):
        answered, _, producer = answer(asked(PEER), existing=set())
    assert answered is False and producer.sent == [] and PEER not in producer.client._topics
    assert "answer_dropped" in caplog.text and PEER in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_answer_never_delivered_ends_with_the_producers_expiry_and_leaves_nothing_tracked(caplog):
    with caplog.at_level(logging.INFO, "dlqapp.kafka.replies"):
        answered, _, producer = answer(asked(PEER), delivery="expires")
    assert answered is False and "answer_dropped" in caplog.text and "KafkaTimeoutError" in caplog.text
    assert PEER not in producer.client._topics


def test_a_broker_that_does_not_say_whether_the_topic_exists_drops_the_answer_within_its_bound(monkeypatch):
    monkeypatch.setattr(replies, "ANSWER_WITHIN_S", 0.05)
    answered, _, producer = answer(asked(PEER), broker_answers=False)
    assert answered is False and producer.sent == []


def test_an_answers_producer_that_cannot_start_drops_the_answer_and_is_closed():
    answered, _, producer = answer(asked(PEER), delivery="no broker")
    assert answered is False and producer.sent == [] and producer.stopped


def test_an_answer_to_this_workers_own_topic_goes_with_fausts_producer_without_asking():
    answered, app, producer = answer(asked(OWN))
    assert answered is True and [t for t, _ in app.sent] == [OWN]
    assert app.sent[0][1].correlation_id == "c-1" and not producer.started


def test_nobody_asked_nothing_is_sent():
    answered, app, producer = answer(SimpleNamespace(key=b"r-1", value={"action": "replay"}, headers={}))
    assert answered is False and app.sent == [] and producer.sent == []


def test_an_ask_named_by_headers_is_answered_like_one_in_the_value():
    headers = {"Faust-Ag-ReplyTo": PEER.encode(), "Faust-Ag-CorrelationId": b"c-1"}
    answered, _, producer = answer(SimpleNamespace(key=b"r-1", value={"action": "replay"}, headers=headers))
    assert answered is True and producer.sent == [(PEER, b"c-1:json")]
