"""Readiness (dlqapp.observability.health): what `GET /readyz` and `dlqapp_worker_ready` say."""

from types import SimpleNamespace

import pytest

from dlqapp.observability.health import readiness, worker_readiness

READY = {"stopping": False, "topics_checked": True, "assigned_partitions": 3, "rebalancing": False, "recovering": False}


def test_a_worker_with_checked_topics_partitions_and_recovered_tables_is_ready():
    state = readiness(**READY)
    assert state.ready and state.reason == "ready"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"stopping": True}, "stopping"),
        ({"topics_checked": False}, "checking topics"),
        ({"rebalancing": True}, "rebalancing"),
        ({"recovering": True}, "recovering tables"),
        ({"assigned_partitions": 0}, "no partitions assigned"),
    ],
)
def test_each_unmet_condition_makes_it_unready_and_is_named(change, reason):
    state = readiness(**{**READY, **change})
    assert not state.ready and state.reason.startswith(reason)


def test_stopping_is_the_reason_whatever_else_holds():
    state = readiness(stopping=True, topics_checked=False, assigned_partitions=0, rebalancing=True, recovering=True)
    assert state.reason == "stopping"


def tp(topic, partition):
    return SimpleNamespace(topic=topic, partition=partition)


def fake_app(**overrides):
    fields = {"should_stop": False, "topics_checked": True, "actives": [tp("input", 0)], "rebalancing": False}
    fields.update(overrides)
    return SimpleNamespace(
        should_stop=fields["should_stop"],
        topics_checked=fields["topics_checked"],
        assignor=SimpleNamespace(assigned_actives=lambda: fields["actives"]),
        dlq_settings=SimpleNamespace(input="input"),
        rebalancing=fields["rebalancing"],
        tables=SimpleNamespace(recovery=SimpleNamespace(in_recovery=fields.get("in_recovery", False))),
    )


def test_the_app_is_read_for_each_condition():
    assert worker_readiness(fake_app()).ready
    assert worker_readiness(fake_app(should_stop=True)).reason == "stopping"
    assert worker_readiness(fake_app(topics_checked=False)).reason == "checking topics"
    assert worker_readiness(fake_app(actives=[])).reason.startswith("no partitions assigned")
    leader_only = [tp("dlqapp-__assignor-__leader", 0), tp("dlqapp-requests-changelog", 0)]
    assert worker_readiness(fake_app(actives=leader_only)).reason.startswith("no partitions assigned")
    assert worker_readiness(fake_app(rebalancing=True)).reason == "rebalancing"
    assert worker_readiness(fake_app(in_recovery=True)).reason == "recovering tables"
    app = fake_app()
    del app.topics_checked  # a Faust app that never ran dlqapp's start
    assert worker_readiness(app).reason == "checking topics"
