"""W3C trace context read tolerantly from headers, and carried on in an envelope's lineage."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlqapp.core.envelope import Envelope, carried_on, lineage_of
from dlqapp.core.headers import trace_context

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
VALID = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.mark.parametrize(
    "value, carried",
    [
        (VALID, VALID),
        (f" {VALID}\t", VALID),  # optional whitespace around it
        (f"00-{TRACE_ID}-{PARENT_ID}-00", f"00-{TRACE_ID}-{PARENT_ID}-00"),  # not sampled: still carried on
        (f"cc-{TRACE_ID}-{PARENT_ID}-01-what-the-future-adds", f"cc-{TRACE_ID}-{PARENT_ID}-01"),  # a later version
    ],
)
def test_a_valid_traceparent_is_carried_on(value, carried):
    assert trace_context({"traceparent": value}) == {"traceparent": carried}


@pytest.mark.parametrize(
    "value",
    [
        "",
        "garbage",
        f"00-{TRACE_ID.upper()}-{PARENT_ID}-01",  # uppercase hex
        f"00-{'0' * 32}-{PARENT_ID}-01",  # the invalid trace id
        f"00-{TRACE_ID}-{'0' * 16}-01",  # the invalid parent id
        f"ff-{TRACE_ID}-{PARENT_ID}-01",  # the forbidden version
        f"00-{TRACE_ID}-{PARENT_ID}-01-more",  # version 00 ends at the flags
        f"00-{TRACE_ID[:-1]}-{PARENT_ID}-01",
        f"00-{TRACE_ID}-{PARENT_ID}-1",
        f"cc-{TRACE_ID}-{PARENT_ID}-01x",  # a later version needs a dash after the flags
        VALID + "-" + "x" * 600,
    ],
)
def test_a_malformed_traceparent_is_read_as_absent(value):
    assert trace_context({"traceparent": value, "tracestate": "vendor=1"}) == {}


def test_a_tracestate_goes_only_with_a_valid_traceparent_and_within_bounds():
    assert trace_context({"traceparent": VALID, "tracestate": "a=1,b=2"}) == {
        "traceparent": VALID,
        "tracestate": "a=1,b=2",
    }
    assert trace_context({"tracestate": "a=1"}) == {}
    assert trace_context({"traceparent": VALID, "tracestate": "a=" + "x" * 600}) == {"traceparent": VALID}
    assert trace_context({"traceparent": VALID, "tracestate": "a=\u00e9"}) == {"traceparent": VALID}
    assert trace_context({"traceparent": VALID, "tracestate": "a=1\nb=2"}) == {"traceparent": VALID}


@given(st.dictionaries(st.sampled_from(["traceparent", "tracestate", "other"]), st.text(max_size=80)))
def test_any_header_values_are_read_without_raising(headers):
    context = trace_context(headers)
    assert set(context) <= {"traceparent", "tracestate"}
    assert "tracestate" not in context or "traceparent" in context


def test_the_trace_context_is_carried_beside_the_replay_lineage_but_is_not_lineage():
    headers = {"traceparent": VALID, "tracestate": "a=1", "replay_count": "2", "replay_of": "0:7", "x": "y"}
    assert lineage_of(headers) == {"replay_of": "0:7", "replay_count": "2"}  # a replay's marks only
    assert carried_on(headers) == {"replay_of": "0:7", "replay_count": "2", "traceparent": VALID, "tracestate": "a=1"}
    fresh = Envelope.fresh("r1", b"{}", headers, written_ms=1, read_from={})
    assert fresh.lineage == carried_on(headers)
    again = Envelope.from_bytes(fresh.to_bytes())  # the parked retry, read after a restart
    assert again.lineage == fresh.lineage
    assert dict(fresh.headers())["traceparent"] == VALID.encode()
