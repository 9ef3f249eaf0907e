"""Test helpers for Kafka itself: produce messages, read topics back as records, and the
request bodies the tests send."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic


@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, str]

    @property
    def json(self) -> Any:
        return json.loads(self.value) if self.value else None


def produce(
    bootstrap: str,
    topic: str,
    messages: Iterable[tuple[bytes | None, bytes | None]],
    headers: list[tuple[str, bytes]] | None = None,
    timestamp_ms: int | None = None,
    client: dict[str, Any] | None = None,
    partition: int | None = None,
) -> None:
    """Send (key, value) pairs and wait for every acknowledgement (`client`: more aiokafka
    options, e.g. a secured broker's, see tests/secure.py)."""

    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_request_size=16 * 1024 * 1024, **(client or {})
        )
        await producer.start()
        try:
            futures = [
                await producer.send(
                    topic, key=k, value=v, headers=headers, timestamp_ms=timestamp_ms, partition=partition
                )
                for k, v in messages
            ]
            await asyncio.gather(*futures)
        finally:
            await producer.stop()

    asyncio.run(run())


def topics_named(bootstrap: str, prefix: str, client: dict[str, Any] | None = None) -> set[str]:
    """The topics on the broker whose names start with `prefix` (`client`: as for `produce`)."""

    async def run() -> set[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **(client or {}))
        await admin.start()
        try:
            return {t for t in await admin.list_topics() if t.startswith(prefix)}
        finally:
            await admin.close()

    return asyncio.run(run())


def request_bytes(request_id: str, **extra: Any) -> bytes:
    body = {"request_id": request_id, "messages": [{"role": "user", "content": f"hello {request_id}"}], **extra}
    return json.dumps(body).encode()


def read_topic(
    bootstrap: str,
    topic: str | list[str],
    until: Callable[[list[Record]], bool],
    timeout: float,
    partitions: int = 3,
    client: dict[str, Any] | None = None,
) -> list[Record]:
    """Read `topic` (or several) from the beginning until `until(records)` holds; fail on timeout.
    Committed records only, as the contract asks of dlqapp's consumers (unless `client` says otherwise)."""
    topics = [topic] if isinstance(topic, str) else topic

    async def run() -> list[Record]:
        options = {"isolation_level": "read_committed", **(client or {})}
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest", **options
        )
        await consumer.start()
        try:
            consumer.assign([TopicPartition(t, p) for t in topics for p in range(partitions)])
            await consumer.seek_to_beginning()
            records: list[Record] = []
            deadline = time.monotonic() + timeout
            while not until(records):
                if time.monotonic() > deadline:
                    raise AssertionError(f"timed out after {timeout}s reading {topic}: {len(records)} records so far")
                batch = await consumer.getmany(timeout_ms=200)
                records += [record_of(m) for messages in batch.values() for m in messages]
            return records
        finally:
            await consumer.stop()

    return asyncio.run(run())


def keys_seen(records: list[Record]) -> set[str]:
    return {r.key.decode() for r in records if r.key is not None}


def all_keys_seen(wanted: set[str]) -> Callable[[list[Record]], bool]:
    """A `read_topic` condition: every key in `wanted` has a non-null record.

    Looks only at records it has not seen before, so long reads stay linear.
    """
    seen: set[str] = set()
    looked = 0

    def complete(records: list[Record]) -> bool:
        nonlocal looked
        for record in records[looked:]:
            if record.key is not None and record.value is not None:
                seen.add(record.key.decode())
        looked = len(records)
        return wanted <= seen

    return complete


def read_until_quiet(
    bootstrap: str,
    topics: list[str],
    partitions: int,
    client: dict[str, Any] | None,
    quiet_s: float,
    timeout: float = 300,
) -> list[Record]:
    """Every record of `topics` (committed ones, unless `client` says otherwise), read once
    their end offsets have not moved for `quiet_s`."""

    async def run() -> list[Record]:
        options = {"isolation_level": "read_committed", **(client or {})}
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest", **options
        )
        await consumer.start()
        try:
            tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
            consumer.assign(tps)
            await consumer.seek_to_beginning()
            records: list[Record] = []
            deadline = time.monotonic() + timeout
            ends, still_since = await consumer.end_offsets(tps), time.monotonic()
            while True:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{topics} did not go quiet within {timeout}s")
                batch = await consumer.getmany(timeout_ms=200)
                records += [record_of(m) for messages in batch.values() for m in messages]
                now_ends = await consumer.end_offsets(tps)
                if now_ends != ends:
                    ends, still_since = now_ends, time.monotonic()
                read_all = all([await consumer.position(tp) >= end for tp, end in ends.items()])
                if read_all and time.monotonic() - still_since >= quiet_s:
                    return records
        finally:
            await consumer.stop()

    return asyncio.run(run())


def record_of(m: Any) -> Record:
    """An aiokafka message as a test `Record` (headers decoded)."""
    headers = {k: v.decode("utf-8", "replace") for k, v in (m.headers or [])}
    return Record(m.topic, m.partition, m.offset, m.timestamp, m.key, m.value, headers)


async def create_topics(bootstrap: str, *names: str) -> None:
    """Create each topic with one partition and one replica."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 1, 1) for name in names])
    finally:
        await admin.close()
