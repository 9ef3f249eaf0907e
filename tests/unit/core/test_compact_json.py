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
