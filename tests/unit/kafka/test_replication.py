"""Replication settings and the checks a worker makes before it creates topics."""

import logging

import pytest

from dlqapp.kafka.admin import topic_configs
from dlqapp.kafka.topic_checks import TopicMismatchError, TopicShape, check_brokers, check_replicas
from dlqapp.settings import Settings, SettingsError


@pytest.mark.parametrize("rf, expected", [("1", 1), ("2", 2), ("3", 2), ("5", 2)])
def test_min_insync_replicas_defaults_to_the_smaller_of_two_and_the_replication_factor(rf, expected):
    assert Settings.from_env({"DLQ_REPLICATION_FACTOR": rf}).min_insync_replicas == expected


def test_min_insync_replicas_can_be_set_up_to_the_replication_factor():
    assert Settings.from_env({"DLQ_REPLICATION_FACTOR": "3", "DLQ_MIN_INSYNC_REPLICAS": "3"}).min_insync_replicas == 3
    assert Settings.from_env({"DLQ_REPLICATION_FACTOR": "3", "DLQ_MIN_INSYNC_REPLICAS": "1"}).min_insync_replicas == 1


@pytest.mark.parametrize(
    "env",
    [
        {"DLQ_MIN_INSYNC_REPLICAS": "2"},
        {"DLQ_REPLICATION_FACTOR": "2", "DLQ_MIN_INSYNC_REPLICAS": "3"},
        {"DLQ_MIN_INSYNC_REPLICAS": "0"},
        {"DLQ_MIN_INSYNC_REPLICAS": "two"},
    ],
)
def test_an_impossible_min_insync_replicas_is_refused_naming_the_setting(env):
    with pytest.raises(SettingsError, match="DLQ_MIN_INSYNC_REPLICAS"):
        Settings.from_env(env)


def test_every_topic_is_created_with_min_insync_replicas_and_the_dlq_compacted():
    settings = Settings.from_env({"DLQ_REPLICATION_FACTOR": "3"})
    configs = topic_configs(settings)
    assert set(configs) == set(settings.all_topics())
    assert {c["min.insync.replicas"] for c in configs.values()} == {"2"}
    assert configs[settings.dlq]["cleanup.policy"] == "compact"
    assert all("cleanup.policy" not in c for name, c in configs.items() if name != settings.dlq)


def test_missing_topics_on_too_few_brokers_are_refused_naming_the_setting():
    settings = Settings.from_env({"DLQ_REPLICATION_FACTOR": "3", "DLQ_KAFKA_BOOTSTRAP": "k1:9092"})
    with pytest.raises(TopicMismatchError) as caught:
        check_brokers(settings, [1, 2], ["input", "dlq"])
    message = str(caught.value)
    assert "DLQ_REPLICATION_FACTOR=3" in message and "has 2 (ids 1,2)" in message and "k1:9092" in message
    check_brokers(settings, [1, 2, 3], ["input"])


def test_existing_topics_with_fewer_replicas_than_min_insync_are_refused():
    settings = Settings.from_env({"DLQ_REPLICATION_FACTOR": "3"})
    with pytest.raises(TopicMismatchError, match=r"DLQ_MIN_INSYNC_REPLICAS=2.*input has 1"):
        check_replicas(settings, {"input": TopicShape(3, 1), "dlq": TopicShape(3, 3)})


def test_existing_topics_below_the_replication_factor_are_only_reported(caplog):
    settings = Settings.from_env({"DLQ_REPLICATION_FACTOR": "3"})
    with caplog.at_level(logging.WARNING):
        check_replicas(settings, {"input": TopicShape(3, 2), "dlq": TopicShape(3, 3)})
    assert (
        "topics_under_replicated" in caplog.text
        and "input" in caplog.text
        and "dlq" not in caplog.text.split("topics=")[1]
    )
