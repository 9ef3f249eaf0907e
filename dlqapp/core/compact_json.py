"""Compact JSON out: what dlqapp writes per request (results, states, retry headers, model calls),
and JSON in.

orjson writes it several times faster than the standard library, which showed in every
request's profile. What orjson refuses (an integer beyond 64 bits in a request's metadata,
a key that is not a string) is written by the standard library instead, so any value the
standard library could write is still written. orjson writes non-ASCII characters as UTF-8
(the standard library escaped them) and NaN or infinity as null (the standard library wrote
`NaN`, which is not JSON).

JSON in (`loads`): orjson reads what it can read exactly as the standard library does; what
it refuses or would read otherwise (an integer beyond 64 bits, as a float) the standard
library reads, so values and errors are the standard library's.
"""

from __future__ import annotations

import json
import re
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


_LONG_NUMBER = re.compile(rb"[0-9]{19}")
"""19 digits in a row: an integer orjson may read as a float (past 64 bits), or a long fraction."""


def loads(data: str | bytes) -> Any:
    """JSON text as the standard library reads it (its values, its errors), faster."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if _LONG_NUMBER.search(raw) is None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # not JSON to orjson (NaN, a lone surrogate, a BOM, deep nesting...): the standard library says
    return json.loads(data)
