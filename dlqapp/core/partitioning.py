"""Which partition owns a request: the same on every topic and table of dlqapp."""

from __future__ import annotations

from functools import lru_cache

from aiokafka.partitioner import murmur2

OWNER_CACHE_SIZE = 65536
"""Request ids whose partition is remembered: aiokafka's murmur2 is pure Python (about 3 µs),
and every message about a request asks for its owner again."""


@lru_cache(maxsize=OWNER_CACHE_SIZE)
def owner_partition(request_id: str, partitions: int) -> int:
    """Kafka's default key partitioning (murmur2) of the request id.

    dlqapp sends every message about a request to this partition explicitly, so the
    request's dedup entry, state, parked retries and DLQ entry share one worker.
    """
    hashed: int = murmur2(request_id.encode())  # aiokafka ships no type information
    return (hashed & 0x7FFFFFFF) % partitions
