"""Whether this worker's Kafka settings reached the cluster before, across processes.

A listener that closes connections at once is ambiguous: another protocol than
DLQ_KAFKA_SECURITY_PROTOCOL, or a broker down behind a proxy. A worker whose very
settings (bootstrap servers and protocol) worked before, in an earlier process on the
same data directory, is facing a broker away; a worker with new settings may be facing a
misconfiguration and must say so within seconds. The mark holds a digest of those
settings only, never a secret.
"""

from __future__ import annotations

import hashlib
import os

from dlqapp.settings import Settings

MARK_NAME = "kafka-reached"


def _digest(settings: Settings) -> str:
    listener = f"{settings.kafka_bootstrap}|{settings.kafka_security.protocol}"
    return hashlib.sha256(listener.encode()).hexdigest()


def _path(settings: Settings) -> str:
    return os.path.join(settings.data_dir, MARK_NAME)


def reached_before(settings: Settings) -> bool:
    """True when an earlier start with these bootstrap servers and protocol got through."""
    try:
        with open(_path(settings), encoding="ascii") as mark:
            return mark.read().strip() == _digest(settings)
    except (OSError, UnicodeDecodeError):
        return False


def mark_reached(settings: Settings) -> None:
    """Remember that these settings got through (best effort: a read-only data directory
    only shortens the patience of the next start); a mark already there is left as it is."""
    if reached_before(settings):
        return
    try:
        os.makedirs(settings.data_dir, exist_ok=True)
        temporary = _path(settings) + ".tmp"
        with open(temporary, "w", encoding="ascii") as mark:
            mark.write(_digest(settings))
        os.replace(temporary, _path(settings))
    except OSError:
        pass
