import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlqapp.core.envelope import Attempt, Envelope
from dlqapp.core.headers import header_dict
from dlqapp.core.requests import (
    InvalidRequest,
    fallback_key,
    parse_request,
    salvage_request_id,
)

LIMIT = 10_000


def ok(**extra):
    return json.dumps({"request_id": "r1", "messages": [{"role": "user", "content": "hi"}], **extra}).encode()


def test_a_valid_request_parses():
    request = parse_request(ok(model="m", params={"temperature": 0}, metadata={"team": "rag"}), LIMIT)
    assert request.request_id == "r1" and request.model == "m" and request.metadata == {"team": "rag"}


def test_prompt_form_is_accepted():
    assert parse_request(b'{"request_id": "p", "prompt": "hello"}', LIMIT).prompt == "hello"


@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"", "empty"),
        (None, "empty"),
        (b"not json", "not valid JSON"),
        (b"\xff\xfe\x00", "UTF-8"),
        (b"[1, 2]", "JSON object"),
        (b"42", "JSON object"),
        (b"null", "JSON object"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "request_id"),
        (b'{"request_id": "", "prompt": "x"}', "request_id"),
        (b'{"request_id": 5, "prompt": "x"}', "request_id"),
        (json.dumps({"request_id": "x" * 257, "prompt": "x"}).encode(), "request_id"),
        (b'{"request_id": "r"}', "messages or prompt"),
        (b'{"request_id": "\\ud800", "prompt": "x"}', "request_id"),
        (b'{"request_id": "r", "messages": "hi"}', "messages must be"),
        (b'{"request_id": "r", "messages": [{"role": "wizard", "content": "x"}]}', "role"),
        (b'{"request_id": "r", "prompt": "x", "params": [1]}', "params"),
        (b'{"request_id": "r", "prompt": "x", "model": 3}', "model"),
        (b"[" * 100_000 + b"]" * 100_000, "JSON"),
    ],
)
def test_invalid_payloads_are_rejected_with_a_reason(payload, reason):
    with pytest.raises(InvalidRequest, match=reason):
        parse_request(payload, 10_000_000)


def test_oversized_payload_is_rejected_before_parsing():
    with pytest.raises(InvalidRequest, match="over the 100-byte limit"):
        parse_request(ok(padding="x" * 200), 100)


def test_request_id_is_salvaged_from_invalid_requests():
    with pytest.raises(InvalidRequest) as info:
        parse_request(b'{"request_id": "r9", "messages": 7}', LIMIT)
    assert info.value.request_id == "r9"
    assert salvage_request_id(b'{"request_id": "r9"}') == "r9"
    assert salvage_request_id(b"garbage") is None
    assert fallback_key(b"garbage") == fallback_key(b"garbage") != fallback_key(b"other")


@given(st.binary(max_size=2000))
def test_parser_never_raises_anything_but_invalid_request(payload):
    with contextlib.suppress(InvalidRequest):
        parse_request(payload, LIMIT)


@given(st.binary(max_size=500), st.text(min_size=1, max_size=50), st.integers(min_value=0, max_value=10))
def test_envelope_round_trips_through_headers_and_blob_with_bytes_intact(payload, request_id, attempts):
    envelope = Envelope(
        request_id, payload, original_timestamp=123, source={"topic": "input", "partition": 1, "offset": 9}
    )
    for n in range(1, attempts + 1):
        envelope.record(Attempt(n, 1000 + n, "input", due_ms=900 + n, error_class="timeout", error=f"slow {n}"))
    envelope.due_ms = 5000
    for copy in (
        Envelope.from_bytes(envelope.to_bytes()),
        Envelope.from_headers(request_id, payload, header_dict(envelope.headers())),
    ):
        assert copy.payload == payload
        assert copy.request_id == request_id
        assert copy.attempts == attempts
        assert copy.history == envelope.history
        assert copy.due_ms == 5000 and copy.original_timestamp == 123


def test_every_dlqapp_header_is_parsed_tolerantly():
    from dlqapp.core.envelope import Envelope
    from dlqapp.core.headers import header_dict, header_int, header_json

    hostile = [
        ("original_timestamp", b"abc"),
        ("retry_count", b"-1"),
        ("attempts", b"\xff\xfe"),
        ("scheduled_time", b"99999999999999999999999"),
        ("attempt_history", b"5"),
        ("source", b"[1, 2]"),
        ("replay_count", b"x"),
        ("replay_count", b""),
        ("dead_at", None),
    ]
    envelope = Envelope.from_headers("r1", b"{}", header_dict(hostile))  # parsed at the door, as every record is
    assert envelope.attempts == 0 and envelope.due_ms is None
    assert envelope.history == [] and envelope.source == {}
    assert "replay_count" not in envelope.lineage
    assert header_int({"original_timestamp": "abc"}, "original_timestamp") is None
    assert header_int({"original_timestamp": " 1700000000000 "}, "original_timestamp") == 1700000000000
    assert header_json({"source": "{}"}, "source", dict) == {} and header_json({"source": "[]"}, "source", dict) is None


def test_state_changes_move_the_right_counters():
    from dlqapp.core import states

    first = states.transition(None, "r", states.RETRY_SCHEDULED, 1, tier="retry-1s")
    assert states.counted(None, first) == ["received", "retried|retry-1s"]
    done = states.transition(first, "r", states.SUCCEEDED, 2)
    assert states.counted(first, done) == ["succeeded"]
    replayed = states.transition(done, "r", states.REPROCESSED, 3)
    again = states.transition(replayed, "r", states.SUCCEEDED, 4)
    assert states.counted(replayed, again) == []  # a forced replay does not count a second success
    dead = states.transition(None, "d", states.DEAD_LETTERED, 1, error_class="auth_error")
    assert states.counted(None, dead) == ["received", "dead_lettered|auth_error"]


def test_expirable_records_and_log_rotation(tmp_path):
    import json

    from dlqapp.deadletters.log_file import rotate
    from dlqapp.tables.retention import ledger_last_change, request_last_change

    assert request_last_change(json.dumps({"state": "succeeded", "updated_at": 5}).encode()) == 5
    assert request_last_change(json.dumps({"state": "retry_scheduled", "updated_at": 5}).encode()) is None
    assert request_last_change(b"\xff") is None
    assert ledger_last_change(json.dumps([{"at": 1}, {"at": 9}]).encode()) == 9
    log = tmp_path / "dead-letters.jsonl"
    for n in range(4):
        log.write_text(f"generation {n}\n")
        rotate(str(log), 2)
    assert (tmp_path / "dead-letters.jsonl.1").read_text() == "generation 3\n"
    assert (tmp_path / "dead-letters.jsonl.2").read_text() == "generation 2\n"
    assert not (tmp_path / "dead-letters.jsonl.3").exists() and not log.exists()
