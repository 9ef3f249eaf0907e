"""dlqapp.core.compact_json: the same JSON values the standard library writes, faster."""

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from dlqapp.core import compact_json

SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=30)


@given(VALUES)
def test_any_value_reads_back_as_the_standard_librarys_json_of_it(value):
    written = compact_json.dumps(value)
    assert json.loads(written) == json.loads(json.dumps(value))
    assert b"\n" not in written  # a parked retry's blob ends its JSON at the first newline
    assert compact_json.dumps_str(value) == written.decode()


def test_what_orjson_refuses_is_written_by_the_standard_library():
    huge = 123456789012345678901234567890
    assert json.loads(compact_json.dumps({"metadata": {"id": huge}})) == {"metadata": {"id": huge}}
    assert json.loads(compact_json.dumps({1: "a"})) == {"1": "a"}


def test_output_is_compact_utf8_and_nan_is_null():
    assert compact_json.dumps({"a": [1, 2], "b": "é\n"}) == '{"a":[1,2],"b":"é\\n"}'.encode()
    assert compact_json.dumps({"x": math.nan, "y": math.inf}) == b'{"x":null,"y":null}'


def _read(loads, text):
    """What a reader makes of `text`: its value, or the kind of error it raises."""
    try:
        return ("value", loads(text))
    except (ValueError, RecursionError) as exc:
        return ("error", type(exc).__name__, str(exc))


def _same(a, b):
    """Equal values of equal types all the way down (1 and 1.0 differ; NaN equals NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


JSONISH = st.text(alphabet='{}[]":,. -+eE0123456789tfnrulasNIiyD\\u\ud800\udc00\ufeffé\x00\n', max_size=40)


@given(VALUES.map(json.dumps) | JSONISH | VALUES.map(lambda value: json.dumps(value, indent=1)))
def test_reading_gives_the_standard_librarys_values_and_errors(text):
    for data in (text, text.encode("utf-8", "surrogatepass")):
        assert _same(_read(compact_json.loads, data), _read(json.loads, data))


def test_what_orjson_reads_otherwise_or_refuses_is_read_by_the_standard_library():
    for text in (
        "123456789012345678901234567890",  # orjson: a float
        "-9223372036854775809",
        '{"usage": {"total_tokens": 18446744073709551616}}',
        "NaN",
        "1e400",
        '"\\ud800"',  # a lone surrogate
        "\ufeff{}",
        "[" * 2000 + "]" * 2000,
    ):
        assert _same(_read(compact_json.loads, text), _read(json.loads, text)), text
