"""A listener that closes connections at once: retried for a while (a broker down behind a
proxy), then taken for another protocol (dlqapp.kafka.admin.connect_admin)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka.errors import KafkaConnectionError

from dlqapp.kafka import admin
from dlqapp.kafka.access import KafkaAccessError
from dlqapp.settings import Settings


class ClosingAdmin:
    """An admin client whose listener closes every connection at once (aiokafka logs why)."""

    def __init__(self, **options: object) -> None:
        pass

    async def start(self) -> None:
        logging.getLogger("aiokafka").error('Unable connect to "127.0.0.1:9": Connection at 127.0.0.1:9 closed')
        raise KafkaConnectionError("closed")

    async def close(self) -> None:
        pass


def test_connections_closed_at_once_are_retried_for_a_while_then_named(monkeypatch):
    monkeypatch.setattr(admin, "AIOKafkaAdminClient", ClosingAdmin)
    now = [100.0]
    monkeypatch.setattr(admin.time, "monotonic", lambda: now[0])
    settings = Settings.from_env({})
    closed = admin.ClosedAtOnce(admin.CLOSED_AT_ONCE_FOR_S)
    with pytest.raises(KafkaConnectionError):  # at first: perhaps a broker restarting behind a proxy
        asyncio.run(admin.connect_admin(settings, closed))
    now[0] += admin.CLOSED_AT_ONCE_FOR_S - 1
    with pytest.raises(KafkaConnectionError):
        asyncio.run(admin.connect_admin(settings, closed))
    now[0] += 2  # still closed after the whole while: another protocol
    with pytest.raises(KafkaAccessError, match="DLQ_KAFKA_SECURITY_PROTOCOL=PLAINTEXT"):
        asyncio.run(admin.connect_admin(settings, closed))


def test_a_worker_restarted_in_place_bears_closed_connections_as_long_as_the_checks_retry(monkeypatch):
    """It connected with these settings before: a broker restarting behind a proxy, not a protocol."""
    monkeypatch.setattr(admin, "AIOKafkaAdminClient", ClosingAdmin)
    now = [100.0]
    monkeypatch.setattr(admin.time, "monotonic", lambda: now[0])
    closed = admin.ClosedAtOnce(admin.RETRY_FOR_S)
    for _ in range(3):
        with pytest.raises(KafkaConnectionError):
            asyncio.run(admin.connect_admin(Settings.from_env({}), closed))
        now[0] += admin.CLOSED_AT_ONCE_FOR_S


def test_the_cause_is_read_even_where_logging_hides_aiokafka_errors(monkeypatch):
    monkeypatch.setattr(admin, "AIOKafkaAdminClient", ClosingAdmin)
    quiet = logging.getLogger("aiokafka")
    previous = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        with pytest.raises(KafkaAccessError, match="DLQ_KAFKA_SECURITY_PROTOCOL=PLAINTEXT"):
            asyncio.run(admin.connect_admin(Settings.from_env({}), admin.ClosedAtOnce(0.0)))
        assert quiet.level == logging.CRITICAL  # as it was
    finally:
        quiet.setLevel(previous)
