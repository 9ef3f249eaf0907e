"""Grow a stopped deployment to more partitions, its state included.

Every dlqapp topic and table has `DLQ_PARTITIONS` partitions, and a request lives on the
partition its id hashes to (dlqapp.core.partitioning). More partitions change where most
ids hash to, so adding partitions alone would strand dedup state, dead letters and parked
retries on partitions that no longer own them. `grow` does the whole move, with every
worker of the app stopped:

1. adds partitions to every dlqapp topic and every table changelog (Kafka can only add);
2. moves each table entry whose owner changed: written to its new partition, tombstoned
   on the old one (workers apply both when they recover the tables);
3. moves the records not yet consumed from the retry tiers, the due topic, the DLQ topic
   and the command topic to their owners' partitions, and commits the group past the
   originals. Records left on `input` need nothing: a worker forwards a request read on a
   partition that does not own it (dlqapp.tables.request_store).

It is safe to run again after an interruption: moved entries are where they belong, the
rest move. The running counts (the `stats` table) stay on their partitions; they are read
as sums, so the totals stay right. So does each partition's progress (the `progress`
table): offsets of existing partitions do not change when partitions are added.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

from dlqapp.core.partitioning import owner_partition
from dlqapp.deadletters.entries import owner_id
from dlqapp.retries.keys import decode_parked_key
from dlqapp.settings import Settings

log = logging.getLogger(__name__)

TIME_PREFIX = 8
"""Bytes of the big-endian time that prefixes the keys of the time-ordered tables."""

OWNER_OF_KEY: dict[str, Callable[[bytes], str]] = {
    "requests": lambda key: key.decode("utf-8", "replace"),
    "replay-ledger": lambda key: key.decode("utf-8", "replace"),
    "dead-letters": lambda key: owner_id(key.decode("utf-8", "replace")),
    "dead-letters-by-time": lambda key: owner_id(key[TIME_PREFIX:].decode("utf-8", "replace")),
    "parked-retries": lambda key: decode_parked_key(key)[1],
}
"""Table name → the request id a key of that table belongs to (`stats` stays: see above)."""

STILL_TABLES = ("stats", "progress")


class GrowRefused(RuntimeError):
    """The move cannot start: the message says what to change."""


@dataclass
class GrowReport:
    """What `grow` did."""

    partitions_before: int
    partitions_after: int
    topics_grown: list[str] = field(default_factory=list)
    entries_moved: Counter[str] = field(default_factory=Counter)
    records_moved: Counter[str] = field(default_factory=Counter)


def changelog(settings: Settings, table: str) -> str:
    """Faust's changelog topic of `table`."""
    return f"{settings.app_id}-{table}-changelog"


async def grow(settings: Settings, to: int) -> GrowReport:
    """Move a stopped deployment from `DLQ_PARTITIONS` to `to` partitions (see the module)."""
    before = settings.partitions
    if to <= before:
        raise GrowRefused(f"--to {to} must be more than DLQ_PARTITIONS={before} (Kafka cannot remove partitions)")
    report = GrowReport(before, to)
    admin = AIOKafkaAdminClient(**settings.kafka_client(client_id=f"{settings.app_id}-grow"))
    await admin.start()
    try:
        await _refuse_while_running(admin, settings.app_id)
        tables = {changelog(settings, t): t for t in (*OWNER_OF_KEY, *STILL_TABLES)}
        counts = await _partition_counts(admin, [*settings.all_topics(), *tables])
        _refuse_odd_counts(counts, before, to)
        report.topics_grown = sorted(name for name, count in counts.items() if count == before)
        if report.topics_grown:
            await admin.create_partitions({name: NewPartitions(total_count=to) for name in report.topics_grown})
        committed = await admin.list_consumer_group_offsets(settings.app_id)
    finally:
        await admin.close()
    producer = AIOKafkaProducer(
        **settings.kafka_client(acks="all", enable_idempotence=True, max_request_size=settings.producer_request_bytes)
    )
    await producer.start()
    try:
        for name, table in tables.items():
            if name in counts and table in OWNER_OF_KEY:
                report.entries_moved[table] = await _move_entries(
                    settings, producer, name, OWNER_OF_KEY[table], before, to
                )
        for topic in [*settings.retry_topics, settings.due, settings.dlq, settings.commands]:
            report.records_moved[topic] = await _move_unconsumed(settings, producer, topic, committed, before, to)
        await producer.flush()
    finally:
        await producer.stop()
    return report


async def _refuse_while_running(admin: AIOKafkaAdminClient, group: str) -> None:
    for response in await admin.describe_consumer_groups([group]):
        for entry in response.groups:  # (error_code, group, state, protocol_type, protocol, members, ...)
            members = entry[5]
            if members:
                raise GrowRefused(
                    f"the consumer group {group} has {len(members)} live member(s): stop every worker of "
                    f"DLQ_APP_ID={group} first"
                )


async def _partition_counts(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    listed = set(await admin.list_topics())
    present = [n for n in names if n in listed]
    described = await admin.describe_topics(present) if present else []
    return {d["topic"]: len(d["partitions"]) for d in described if d["error_code"] == 0}


def _refuse_odd_counts(counts: dict[str, int], before: int, to: int) -> None:
    odd = {name: count for name, count in counts.items() if count not in (before, to)}
    if odd:
        found = ", ".join(f"{n} has {c}" for n, c in sorted(odd.items()))
        raise GrowRefused(f"expected {before} partitions (DLQ_PARTITIONS) or {to} (--to): {found}")


async def _read(settings: Settings, topic: str, partition: int, start: int | None = None) -> list:
    """Every record of one partition from `start` (default: its beginning) to its end now."""
    tp = TopicPartition(topic, partition)
    consumer = AIOKafkaConsumer(
        **settings.kafka_client(
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=settings.table_record_bytes,
        )
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        first = (await consumer.beginning_offsets([tp]))[tp]
        consumer.seek(tp, first if start is None else max(start, first))
        records = []
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=1000)
            records += [r for r in batch.get(tp, []) if r.offset < end]
        return records
    finally:
        await consumer.stop()


async def _move_entries(
    settings: Settings, producer: AIOKafkaProducer, topic: str, owner: Callable[[bytes], str], before: int, to: int
) -> int:
    """Move the live entries of one changelog whose owner partition changed; returns how many."""
    moved = 0
    for partition in range(before):
        live: dict[bytes, bytes] = {}
        for record in await _read(settings, topic, partition):
            if record.value is None:
                live.pop(record.key, None)
            else:
                live[record.key] = record.value
        for key, value in live.items():
            target = owner_partition(owner(key), to)
            if target != partition:
                await producer.send(topic, key=key, value=value, partition=target)
                await producer.send(topic, key=key, value=None, partition=partition)
                moved += 1
    return moved


async def _move_unconsumed(
    settings: Settings, producer: AIOKafkaProducer, topic: str, committed: dict, before: int, to: int
) -> int:
    """Re-send the records after the group's committed offset to their owners' partitions
    (the ones that stay are re-sent to their own), then commit past the originals."""
    moved = 0
    ends: dict[TopicPartition, int] = {}
    for partition in range(before):
        tp = TopicPartition(topic, partition)
        done = committed.get(tp)
        records = await _read(
            settings, topic, partition, start=done.offset if done is not None and done.offset >= 0 else None
        )
        for record in records:
            target = owner_partition(owner_id(record.key.decode("utf-8", "replace")), to) if record.key else partition
            await producer.send(
                topic,
                key=record.key,
                value=record.value,
                headers=list(record.headers or ()),
                partition=target,
                timestamp_ms=record.timestamp,
            )
        moved += len(records)
        if records:
            ends[tp] = records[-1].offset + 1
    if ends:
        await producer.flush()
        await _commit(settings, ends)
    return moved


async def _commit(settings: Settings, offsets: dict[TopicPartition, int]) -> None:
    """Commit `offsets` for the app's consumer group (it has no members now)."""
    consumer = AIOKafkaConsumer(**settings.kafka_client(group_id=settings.app_id, enable_auto_commit=False))
    await consumer.start()
    try:
        consumer.assign(list(offsets))
        await consumer.commit(offsets)
    finally:
        await consumer.stop()
