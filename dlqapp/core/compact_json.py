"""Compact JSON out: what dlqapp writes per request (results, states, retry headers, model calls).

orjson writes it several times faster than the standard library, which showed in every
request's profile. What orjson refuses (an integer beyond 64 bits in a request's metadata,
a key that is not a string) is written by the standard library instead, so any value the
standard library could write is still written. orjson writes non-ASCII characters as UTF-8
(the standard library escaped them) and NaN or infinity as null (the standard library wrote
`NaN`, which is not JSON). Reading stays with the standard library: orjson reads integers
beyond 64 bits as floats.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    """`value` as compact JSON in UTF-8."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(value, separators=(",", ":")).encode()


def dumps_str(value: Any) -> str:
    """`value` as compact JSON text (a header's value)."""
    return dumps(value).decode()
