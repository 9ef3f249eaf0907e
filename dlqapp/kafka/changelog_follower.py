"""Follows a compacted changelog topic from its beginning: every partition, outside the group.

Used for state every worker needs whole, whichever partitions it owns (the spend of every
partition and the budgets set at run time, dlqapp.tables.spend_view). A plain consumer with
no group: manually assigned every partition, read from the beginning, read_committed under
exactly_once (only what committed transactions wrote), so a restarted worker reads the same
totals again. `caught_up` is set once it has read up to the end offsets it found at start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from dlqapp.kafka.topic_consumer import TopicConsumer

log = logging.getLogger("dlqapp.kafka.changelog_follower")

RETRY_S = 2.0


class ChangelogFollower:
    """Hands every record of `topic` to `on_record(partition, key, value)`, in offset order."""

    def __init__(
        self,
        options: dict[str, Any],
        topic: str,
        on_record: Callable[[int, bytes | None, bytes | None], None],
        *,
        read_committed: bool,
        caught_up: asyncio.Event | None = None,
    ) -> None:
        self.options = options
        self.topic = topic
        self.on_record = on_record
        self.read_committed = read_committed
        self.caught_up = caught_up or asyncio.Event()
        self.records = 0

    async def run(self, should_stop: Callable[[], bool]) -> None:
        """Follow the topic until `should_stop()`; reconnects after errors."""
        while not should_stop():
            consumer = TopicConsumer(
                self.topic,
                **self.options,
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                isolation_level="read_committed" if self.read_committed else "read_uncommitted",
            )
            try:
                await consumer.start()
                await self._follow(consumer, should_stop)
            except asyncio.CancelledError:
                raise
            except (KafkaError, OSError) as exc:
                log.warning("following %s failed, retrying in %.0f s: %r", self.topic, RETRY_S, exc)
                await asyncio.sleep(RETRY_S)
            finally:
                await consumer.stop()

    async def _follow(self, consumer: TopicConsumer, should_stop: Callable[[], bool]) -> None:
        partitions = consumer.partitions_for_topic(self.topic)
        while not partitions:
            await (
                consumer._client.force_metadata_update()
            )  # the topic may be created moments from now (asked for alone)
            partitions = consumer.partitions_for_topic(self.topic)
            if not partitions:
                await asyncio.sleep(RETRY_S)
        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        pending = {tp for tp in tps if ends[tp] > 0}
        if not pending:
            self.caught_up.set()
        while not should_stop():
            batches = await consumer.getmany(timeout_ms=500, max_records=1000)
            for tp, records in batches.items():
                for record in records:
                    self.on_record(tp.partition, record.key, record.value)
                    self.records += 1
            if pending:
                for tp in list(pending):
                    if await consumer.position(tp) >= ends[tp]:
                        pending.discard(tp)
                if not pending:
                    self.caught_up.set()
