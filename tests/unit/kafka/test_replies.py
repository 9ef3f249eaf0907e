"""Answers to `ask()`: sent while the asker's reply topic exists, bounded, dropped when it is
gone, and another worker's reply topic is not kept in the producer's metadata topics."""

import asyncio
import logging
from types import SimpleNamespace

from faust.agents.models import ReqRepRequest

from dlqapp.kafka import replies
from dlqapp.kafka.replies import Replies

OWN = "dlqapp-reply-own"
PEER = "dlqapp-reply-peer"


class FakeClient:
    """aiokafka's client as far as answers go: the topics it tracks and one broker's metadata."""

    def __init__(self, existing: set[str], answers: bool = True) -> None:
        self.existing = existing
        self.answers = answers
        self._topics = {"dlqapp-input", OWN}
        self.metadata_requests: list[tuple[list[str], bool]] = []

    def get_random_node(self) -> int:
        return 1

    async def send(self, node_id: int, request) -> SimpleNamespace:
        self.metadata_requests.append((request._topics, request._allow_auto_topic_creation))
        if not self.answers:
            await asyncio.Event().wait()  # a broker that never answers
        topics = [{"topic": t, "error_code": 0 if t in self.existing else 3} for t in request._topics]
        return SimpleNamespace(to_object=lambda: {"topics": topics})

    def set_topics(self, topics) -> None:
        self._topics = set(topics)


class FakeApp:
    """Faust's app as far as answers go: its reply topic, its producer's client and `send`."""

    def __init__(self, client: FakeClient, delivered: bool = True) -> None:
        self.conf = SimpleNamespace(reply_to=OWN)
        self.producer = SimpleNamespace(_producer=SimpleNamespace(client=client))
        self.client = client
        self.delivered = delivered
        self.sent: list[tuple[str, object]] = []

    async def send(self, topic: str, key=None, value=None) -> asyncio.Future:
        self.client._topics.add(topic)  # what aiokafka's send does for a topic it did not know
        self.sent.append((topic, value))
        delivery: asyncio.Future = asyncio.get_running_loop().create_future()
        if self.delivered:
            delivery.set_result("metadata")
        return delivery


class FakeAgent:
    def _response_class(self, value):
        return lambda **fields: SimpleNamespace(**fields)


def asked(reply_to: str) -> SimpleNamespace:
    request = ReqRepRequest(value={"action": "replay"}, reply_to=reply_to, correlation_id="c-1")
    return SimpleNamespace(key=b"r-1", value=request, headers={})


def answer(app: FakeApp, event) -> bool:
    return asyncio.run(Replies(app).answer(FakeAgent(), event, {"status": "reprocessed"}))


def test_an_answer_to_another_workers_topic_is_sent_once_the_topic_is_found_and_then_not_tracked():
    client = FakeClient(existing={PEER})
    app = FakeApp(client)
    assert answer(app, asked(PEER)) is True
    [(topic, record)] = app.sent
    assert topic == PEER and record.correlation_id == "c-1" and record.value == {"status": "reprocessed"}
    assert client.metadata_requests == [([PEER], False)]  # asked without creating it
    assert PEER not in client._topics and client._topics == {"dlqapp-input", OWN}


def test_an_answer_whose_asker_has_stopped_is_dropped_without_a_send_and_said(caplog):
    client = FakeClient(existing=set())
    app = FakeApp(client)
    with caplog.at_level(logging.INFO, "dlqapp.kafka.replies"):
        assert answer(app, asked(PEER)) is False
    assert app.sent == [] and PEER not in client._topics
    assert "answer_dropped" in caplog.text and PEER in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_answer_to_this_workers_own_topic_is_sent_without_asking_and_stays_tracked():
    client = FakeClient(existing=set())  # not even asked
    app = FakeApp(client)
    assert answer(app, asked(OWN)) is True
    assert [t for t, _ in app.sent] == [OWN] and client.metadata_requests == [] and OWN in client._topics


def test_an_answer_never_written_is_dropped_within_its_bound(monkeypatch, caplog):
    monkeypatch.setattr(replies, "ANSWER_WITHIN_S", 0.05)
    client = FakeClient(existing={PEER})
    app = FakeApp(client, delivered=False)  # the topic was deleted after it was found
    with caplog.at_level(logging.INFO, "dlqapp.kafka.replies"):
        assert answer(app, asked(PEER)) is False
    assert "answer_dropped" in caplog.text and PEER not in client._topics


def test_a_broker_that_does_not_say_whether_the_topic_exists_drops_the_answer_within_its_bound(monkeypatch):
    monkeypatch.setattr(replies, "ANSWER_WITHIN_S", 0.05)
    client = FakeClient(existing={PEER}, answers=False)
    app = FakeApp(client)
    assert answer(app, asked(PEER)) is False and app.sent == []


def test_nobody_asked_nothing_is_sent():
    client = FakeClient(existing={PEER})
    app = FakeApp(client)
    event = SimpleNamespace(key=b"r-1", value={"action": "replay"}, headers={})
    assert answer(app, event) is False and app.sent == []


def test_an_ask_named_by_headers_is_answered_like_one_in_the_value():
    client = FakeClient(existing={PEER})
    app = FakeApp(client)
    headers = {"Faust-Ag-ReplyTo": PEER.encode(), "Faust-Ag-CorrelationId": b"c-1"}
    event = SimpleNamespace(key=b"r-1", value={"action": "replay"}, headers=headers)
    assert answer(app, event) is True and app.sent[0][0] == PEER and app.sent[0][1].correlation_id == "c-1"
