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
    closed_since: list[float] = []
    with pytest.raises(KafkaConnectionError):  # at first: perhaps a broker restarting behind a proxy
        asyncio.run(admin.connect_admin(settings, closed_since))
    now[0] += admin.CLOSED_AT_ONCE_FOR_S - 1
    with pytest.raises(KafkaConnectionError):
        asyncio.run(admin.connect_admin(settings, closed_since))
    now[0] += 2  # still closed after the whole while: another protocol
    with pytest.raises(KafkaAccessError, match="DLQ_KAFKA_SECURITY_PROTOCOL=PLAINTEXT"):
        asyncio.run(admin.connect_admin(settings, closed_since))
