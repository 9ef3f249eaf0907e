"""dlqapp's topics and tables, declared once on the app.

Every topic and table carries raw bytes keyed by the request id (UTF-8), so topic keys
and table keys route alike; dlqapp encodes values itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import faust
from faust import TopicT
from faust.serializers import codecs
from faust.types import TableT

from dlqapp.core.commands import UNDECODABLE
from dlqapp.core.tiers import Tier
from dlqapp.settings import Settings
from dlqapp.tables.rocksdb_memory import MEMTABLE_BUDGET, SHARED_CACHE, WITHOUT_WAL
from dlqapp.tables.step import StepContext

TOLERANT_JSON = "dlqapp-json"


class TolerantJson(codecs.json):
    """Faust's JSON codec, except that bytes that are not JSON decode to a marker
    (`{UNDECODABLE: reason}`) instead of crashing the agent: the operator agent then
    dead-letters the message with its original bytes."""

    def _loads(self, s: bytes) -> Any:
        try:
            return super()._loads(s)
        except (ValueError, RecursionError) as exc:
            return {UNDECODABLE: f"not JSON: {exc}"[:300]}


def register_codecs() -> None:
    """Make the tolerant JSON codec known to Faust (idempotent)."""
    codecs.register(TOLERANT_JSON, TolerantJson())


def _raw() -> faust.Schema:
    """A fresh raw-bytes schema (tables update their schema in place, so never share one)."""
    return faust.Schema(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")


@dataclass(frozen=True)
class TierTopic:
    """A retry tier and the topic its retries are published on."""

    tier: Tier
    topic: TopicT


@dataclass(frozen=True)
class Topology:
    """Every topic and table dlqapp declares on its app."""

    input: TopicT
    tiers: tuple[TierTopic, ...]
    due: TopicT
    dlq: TopicT
    results: TopicT
    commands: TopicT
    parked_retries: TableT
    requests: TableT
    dead_letters: TableT
    dead_letters_by_time: TableT
    replay_ledger: TableT
    stats: TableT
    progress: TableT
    steps: StepContext
    """Where the stream step running now is found: every table's writes belong to it."""

    def tier(self, index: int) -> TierTopic:
        return self.tiers[index]


def declare(app: faust.App, settings: Settings) -> Topology:
    """Declare dlqapp's topics and tables on `app` (once, from the composition root)."""
    steps = StepContext()

    def topic(name: str) -> TopicT:
        return app.topic(name, partitions=settings.partitions, schema=_raw())

    def table(name: str, help: str) -> TableT:
        return app.Table(
            name,
            partitions=settings.partitions,
            help=help,
            key_type=bytes,
            value_type=bytes,
            extra_topic_configs={
                "max.message.bytes": str(settings.table_record_bytes),
                "min.insync.replicas": str(settings.min_insync_replicas),
            },
            options=rocksdb_options(settings),
            steps=steps,
        )

    return Topology(
        input=topic(settings.input),
        tiers=tuple(TierTopic(tier, topic(tier.topic)) for tier in settings.tiers),
        due=topic(settings.due),
        dlq=topic(settings.dlq),
        results=topic(settings.results),
        commands=app.topic(
            settings.commands,
            partitions=settings.partitions,
            schema=faust.Schema(key_type=bytes, key_serializer="raw", value_serializer=TOLERANT_JSON),
        ),
        parked_retries=table(
            "parked-retries", "Retries waiting for their due time: key = due_ms (u64 BE) ‖ request id."
        ),
        requests=table("requests", "Each request's settled state and bounded history."),
        dead_letters=table("dead-letters", "DLQ entries keyed by request id."),
        dead_letters_by_time=table(
            "dead-letters-by-time", "DLQ list index: key = dead_at (u64 BE) ‖ DLQ key, value = the entry's summary."
        ),
        replay_ledger=table(
            "replay-ledger", "Operator actions per request id: who replayed or discarded what, and when."
        ),
        stats=table("stats", "Running counts, one blob per partition (dlqapp.tables.counters)."),
        progress=table(
            "progress", "Per topic, the offset handling has committed up to; records that broke a transaction."
        ),
        steps=steps,
    )


def rocksdb_options(settings: Settings) -> dict[str, int]:
    """Bounded RocksDB memory for the whole worker (dlqapp.tables.rocksdb_memory): Faust's
    defaults allow 192 MiB of write buffers and a 2 GiB block cache per table partition.
    Under exactly_once, without the write-ahead log (a start rebuilds the tables anyway)."""
    return {
        "write_buffer_size": settings.table_write_buffer_bytes,
        "max_write_buffer_number": 2,
        "block_cache_size": settings.table_cache_bytes,
        "block_cache_compressed_size": settings.table_cache_bytes,
        SHARED_CACHE: settings.table_cache_bytes,
        MEMTABLE_BUDGET: settings.table_memtable_budget_bytes,
        WITHOUT_WAL: int(settings.exactly_once),
    }
