"""Is there a record at this offset? Asked when a commit would skip one (dlqapp.worker.faust_compat)."""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

PROBE_TIMEOUT_MS = 5_000


class OffsetProbe:
    """Reads one offset of a partition with a short-lived consumer of its own (no group)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    async def __call__(self, tp: Any, offset: int) -> bool | None:
        """True if `offset` of `tp` holds a record, False if the first record after it is later
        (a transaction marker, compaction, retention), None if nothing came back in time."""
        partition = TopicPartition(tp.topic, tp.partition)
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False, auto_offset_reset="earliest", client_id="dlqapp-offset-probe")
        await consumer.start()
        try:
            consumer.assign([partition])
            consumer.seek(partition, offset)
            batch = await consumer.getmany(partition, timeout_ms=PROBE_TIMEOUT_MS, max_records=1)
        finally:
            await consumer.stop()
        records = batch.get(partition) or []
        if not records:
            return None
        return records[0].offset == offset
