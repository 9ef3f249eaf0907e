"""dlqapp's topics and tables, declared once on the app.

Every topic and table carries raw bytes keyed by the request id (UTF-8), so topic keys
and table keys route alike; dlqapp encodes values itself.
"""

from __future__ import annotations

from typing import Any

import faust
from faust import TopicT
from faust.serializers import codecs
from faust.tables import Table

from dlqapp.app import app, settings



TOLERANT_JSON = "dlqapp-json"
UNDECODABLE = "__dlqapp_undecodable__"


class TolerantJson(codecs.json):
    """Faust's JSON codec, except that bytes that are not JSON decode to a marker
    (`{UNDECODABLE: reason}`) instead of crashing the agent: the operator agent then
    dead-letters the message with its original bytes."""

    def _loads(self, s: bytes) -> Any:
        try:
            return super()._loads(s)
        except (ValueError, RecursionError) as exc:
            return {UNDECODABLE: f"not JSON: {exc}"[:300]}


codecs.register(TOLERANT_JSON, TolerantJson())


def _raw() -> faust.Schema:
    """A fresh raw-bytes schema (tables update their schema in place, so never share one)."""
    return faust.Schema(key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")


def _topic(name: str) -> TopicT:
    return app.topic(name, partitions=settings.partitions, schema=_raw())


def _table(name: str, help: str) -> Table:
    return app.Table(
        name,
        partitions=settings.partitions,
        help=help,
        key_type=bytes,
        value_type=bytes,
        extra_topic_configs={"max.message.bytes": str(settings.max_message_bytes)},
        options=_rocksdb_options(),
    )


def _rocksdb_options() -> dict[str, int]:
    """Bounded RocksDB memory per table partition (Faust's defaults allow 192 MiB of write
    buffers and a 2 GiB block cache for each, so resident memory grew with the tables)."""
    return {
        "write_buffer_size": settings.table_write_buffer_bytes,
        "max_write_buffer_number": 2,
        "block_cache_size": settings.table_cache_bytes,
        "block_cache_compressed_size": settings.table_cache_bytes,
    }


input_topic = _topic(settings.input)
tier_topics = [_topic(name) for name in settings.retry_topics]
due_topic = _topic(settings.due)
dlq_topic = _topic(settings.dlq)
results_topic = _topic(settings.results)

parked_retries = _table("parked-retries", "Retries waiting for their due time: key = due_ms (u64 BE) ‖ request id.")
requests_table = _table("requests", "Each request's settled state and bounded history.")
dead_letters = _table("dead-letters", "DLQ entries keyed by request id.")

commands_topic = app.topic(
    settings.commands,
    partitions=settings.partitions,
    schema=faust.Schema(key_type=bytes, key_serializer="raw", value_serializer=TOLERANT_JSON),
)
stats_table = _table("stats", "Running counts, one blob per partition (dlqapp.counters).")
replay_ledger = _table("replay-ledger", "Operator actions per request id: who replayed or discarded what, and when.")
