"""Parked-retry keys: `big-endian u64 due_ms ‖ request_id (UTF-8)`, so byte order is time order.

Pure code. A RocksDB scan from the first key up to `due_upper_bound(now)` yields exactly
the due retries, earliest first.
"""

from __future__ import annotations

import struct

_DUE = struct.Struct(">Q")


def parked_key(due_ms: int, request_id: str) -> bytes:
    """Table key of a parked retry."""
    return _DUE.pack(due_ms) + request_id.encode()


def decode_parked_key(key: bytes) -> tuple[int, str]:
    """(due_ms, request_id) of a parked-retry key."""
    return _DUE.unpack_from(key)[0], key[_DUE.size :].decode("utf-8", "replace")


def due_upper_bound(now_ms: int) -> bytes:
    """Exclusive upper bound that admits every key due at or before `now_ms`."""
    return _DUE.pack(now_ms + 1)
