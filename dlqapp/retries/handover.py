"""The hop from the retry timer to the due agent: an internal topic on a producer of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaProducer

from dlqapp.core.headers import H_RUN_NOW


class HandOver:
    """Hands due keys to the due agent (the internal due topic) on a producer of its own.

    A due message is a hint, not the record: the entry stays parked until the due agent
    deletes it, and a hint lost to a crash is fired again after REFIRE_AFTER_MS. So it
    needs neither acks=all nor idempotence; what it needs is not to queue behind the
    results and changelog writes in Faust's producer, which under an input flood held
    due retries back for a few hundred milliseconds.
    """

    def __init__(self, client: dict[str, Any], topic: str) -> None:
        """`client`: the aiokafka client options of the deployment (Settings.kafka_client)."""
        self.client = client
        self.topic = topic
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(**{**self.client, "acks": 1, "linger_ms": 0})
        await self._producer.start()

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def send(self, key: bytes, value: bytes, partition: int, *, now: bool = False) -> asyncio.Future[Any]:
        """Queue one due message; the returned future resolves once the broker has it.

        `now` (an operator's "run now") marks it to be attempted at once; otherwise the due
        agent waits for the retry's due time (the timer fires ahead of it, see DueLead)."""
        if self._producer is None:
            raise RuntimeError("HandOver.send before start()")
        headers = [(H_RUN_NOW, b"1")] if now else None
        return await self._producer.send(self.topic, value=value, key=key, partition=partition, headers=headers)


def is_run_now(headers: Mapping[str, str]) -> bool:
    """The due message (its parsed headers) asks for the attempt at once (`HandOver.send(now=True)`)."""
    return H_RUN_NOW in headers
