"""The helpers bench shares with the tests: a broker, workers and the mock LLM as
subprocesses, Kafka produce/read, waiting.

They live in tests/support.py (and tests/secure.py); this is the one bench module that
imports from tests/, so the dependency is stated in one place.
"""

from __future__ import annotations

from tests.otlp_sink import OtlpSink
from tests.secure import SecureKafka
from tests.support import (
    FAUST,
    LocalKafka,
    MockLLM,
    Record,
    Worker,
    all_keys_seen,
    free_port,
    keys_seen,
    produce,
    read_topic,
    request_bytes,
    unique,
    unique_ids,
    wait_until,
)

__all__ = [
    "FAUST",
    "LocalKafka",
    "MockLLM",
    "OtlpSink",
    "Record",
    "SecureKafka",
    "Worker",
    "all_keys_seen",
    "free_port",
    "keys_seen",
    "produce",
    "read_topic",
    "request_bytes",
    "unique",
    "unique_ids",
    "wait_until",
]
