"""dlqapp.deadletters.entries: a DLQ entry built from a `dlq` message, the size limit on
its payload, and the original payload given back byte for byte after storage."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlqapp.core.clock import now_ms
from dlqapp.deadletters.entries import PREVIEW_BYTES, owner_id, unprocessable_key
from tests.unit.deadletters.entry_helpers import (
    FULL_HEADERS,
    HISTORY,
    T0,
    build_entry,
    original_payload,
    position,
    presented,
    stored,
    summary,
)

# -- build_entry -------------------------------------------------------------------------


def test_an_entry_carries_every_header_and_the_exact_payload():
    payload = json.dumps(
        {"request_id": "r-1", "model": "gpt-4o-mini", "messages": [{"role": "user", "content": "héllo"}]}
    ).encode()
    entry = build_entry("r-1", payload, dict(FULL_HEADERS), partition=2, offset=99)
    assert entry == {
        "request_id": "r-1",
        "key": "r-1",
        "error_class": "auth_error",
        "final_error": "401 Unauthorized",
        "last_error": "401",
        "retry_count": 1,
        "attempts": 2,
        "history": HISTORY,
        "first_seen": T0 - 500,
        "dead_at": T0 + 1001,
        "source": {"topic": "app.input", "partition": 2, "offset": 17},
        "model": "gpt-4o-mini",
        "replay_count": 3,
        "payload_text": payload.decode(),
        "payload_b64": None,
        "payload_bytes": len(payload),
        "payload_truncated": False,
        "headers": FULL_HEADERS,
        "dlq": {"partition": 2, "offset": 99},
        "tokens": {"prompt": 0, "completion": 0, "cached": 0},
        "cost_usd": 0.0,
        "cost_estimated": None,
        "unpriced": None,
        "tenant": None,
    }
    assert original_payload(entry) == payload


def test_an_entry_without_headers_gets_defaults_and_is_dated_now():
    before = now_ms()
    entry = build_entry("r-1", b'{"prompt": "x"}', {}, partition=0, offset=0)
    after = now_ms()
    assert entry["request_id"] == "r-1" and entry["key"] == "r-1"
    assert entry["error_class"] == "unknown"
    assert entry["final_error"] is None and entry["last_error"] is None
    assert entry["retry_count"] == 0 and entry["attempts"] == 0 and entry["replay_count"] == 0
    assert entry["history"] == [] and entry["source"] == {} and entry["model"] is None
    assert entry["first_seen"] is None
    assert before <= entry["dead_at"] <= after
    assert entry["headers"] == {}


def test_malformed_headers_read_as_absent():
    headers = {
        "error_class": "",
        "retry_count": "-1",
        "attempts": "two",
        "attempt_history": '{"attempt": 1}',  # not a list
        "original_timestamp": "abc",
        "dead_at": "99999999999999999999999",  # beyond a signed 64-bit integer
        "source": "[1, 2]",  # not an object
        "replay_count": "",
        "request_id": "",
    }
    before = now_ms()
    entry = build_entry("r-1", b"{}", headers, partition=0, offset=5)
    assert entry["request_id"] == "r-1"  # an empty request_id header falls back to the key
    assert entry["error_class"] == "unknown"
    assert (entry["retry_count"], entry["attempts"], entry["replay_count"]) == (0, 0, 0)
    assert entry["history"] == [] and entry["source"] == {} and entry["first_seen"] is None
    assert entry["dead_at"] >= before
    assert entry["headers"] == headers  # kept as they came


def test_history_keeps_only_its_objects():
    headers = {"attempt_history": json.dumps([HISTORY[0], "junk", 3, None, [1], HISTORY[1]])}
    assert build_entry("r-1", b"{}", headers, 0, 0)["history"] == HISTORY


def test_the_request_id_header_wins_over_the_key():
    key = unprocessable_key("r-1", "invalid_request", position("app.input", 0, 3))
    entry = build_entry(key, b"{not json", {"request_id": "r-1", "error_class": "invalid_request"}, 0, 3)
    assert entry["key"] == key and entry["request_id"] == "r-1"
    assert owner_id(entry["key"]) == entry["request_id"]


@pytest.mark.parametrize(
    "payload",
    [
        b'{"model": 4, "prompt": "x"}',  # not a string
        b'[{"model": "m"}]',  # not an object
        b'"model"',
        b"{not json",
        b'{"model": "m"',  # cut short
        b"\xef\xbb\xbf" + b'{"model": "m"}',  # a byte order mark is not JSON
        pytest.param(b'{"a": ' * 100_000 + b"1" + b"}" * 100_000, id="too-deep-to-parse"),
    ],
)
def test_a_model_is_read_only_from_a_json_object_with_a_string_model(payload):
    entry = build_entry("r-1", payload, {}, 0, 0)
    assert entry["model"] is None
    assert entry["payload_text"] == payload.decode("utf-8")  # the text is kept all the same
    assert original_payload(entry) == payload


def test_payload_bytes_counts_bytes_not_characters():
    payload = json.dumps({"prompt": "日本語🙂"}, ensure_ascii=False).encode()
    entry = build_entry("r-1", payload, {}, 0, 0)
    assert entry["payload_bytes"] == len(payload) > len(payload.decode())


@pytest.mark.parametrize(
    "payload",
    [
        b"\xff\xfe\xfa binary",
        b"\x80",
        b"\xed\xa0\x80",  # a UTF-16 surrogate encoded as UTF-8: not valid UTF-8
        b"\xc3",  # a two-byte sequence cut short
        pytest.param(bytes(range(256)), id="every-byte"),
        b'{"request_id": "r-1", "prompt": "\xe9t\xe9"}',  # Latin-1 inside JSON
    ],
)
def test_a_payload_that_is_not_utf8_is_kept_as_base64_byte_for_byte(payload):
    entry = build_entry("r-1", payload, {}, 0, 0)
    assert entry["payload_text"] is None
    assert entry["payload_b64"] == base64.b64encode(payload).decode()
    assert entry["payload_bytes"] == len(payload) and entry["model"] is None
    assert original_payload(entry) == payload
    assert original_payload(stored(entry)) == payload


def test_a_null_payload_is_dead_lettered_as_empty_bytes():
    """dlqapp dead-letters a tombstone on `input` with an empty value and `payload_null: true`."""
    entry = build_entry("r-1", b"", {"error_class": "invalid_request", "payload_null": "true"}, 0, 8)
    assert entry["payload_text"] == "" and entry["payload_b64"] is None
    assert entry["payload_bytes"] == 0 and entry["payload_truncated"] is False and entry["model"] is None
    assert entry["headers"]["payload_null"] == "true"
    assert original_payload(entry) == b"" and original_payload(stored(entry)) == b""
    assert presented(entry)["payload"] is None
    assert summary(entry)["payload_preview"] == ""


def test_control_and_nul_characters_are_text_and_survive_storage():
    payload = b'{"prompt": "a\x00b"}\x00\x01\x1f\x7f'
    entry = build_entry("r-1", payload, {}, 0, 0)
    assert entry["payload_text"] == payload.decode() and entry["payload_b64"] is None
    assert original_payload(stored(entry)) == payload


# -- size limit --------------------------------------------------------------------------


def test_no_limit_keeps_every_byte():
    payload = b"x" * (PREVIEW_BYTES * 2)
    entry = build_entry("r-1", payload, {}, 0, 0)
    assert entry["payload_truncated"] is False and original_payload(entry) == payload


def test_a_payload_at_the_limit_is_kept_whole_and_one_byte_over_is_not():
    payload = b"y" * (PREVIEW_BYTES + 10)
    at_limit = build_entry("r-1", payload, {}, 0, 0, max_bytes=len(payload))
    assert at_limit["payload_truncated"] is False and original_payload(at_limit) == payload
    over = build_entry("r-1", payload, {}, 0, 0, max_bytes=len(payload) - 1)
    assert over["payload_truncated"] is True
    assert over["payload_bytes"] == len(payload)  # the real size, not the preview's
    assert original_payload(over) == payload[:PREVIEW_BYTES]


def test_a_truncated_payload_keeps_a_preview_and_where_to_find_the_bytes():
    payload = json.dumps({"request_id": "big", "model": "m", "prompt": "z" * 100_000}).encode()
    entry = build_entry("big", payload, {}, partition=1, offset=1234, max_bytes=70_000)
    assert entry["payload_truncated"] is True and entry["payload_bytes"] == len(payload)
    assert entry["payload_text"] == payload[:PREVIEW_BYTES].decode()
    assert entry["model"] is None  # the preview is not whole JSON
    assert entry["dlq"] == {"partition": 1, "offset": 1234}


def test_a_truncated_preview_cut_inside_a_character_is_still_text():
    payload = b"a" * (PREVIEW_BYTES - 1) + "é".encode() * 100
    entry = build_entry("r-1", payload, {}, 0, 0, max_bytes=PREVIEW_BYTES)
    assert entry["payload_truncated"] is True
    assert entry["payload_text"] == "a" * (PREVIEW_BYTES - 1) + "\ufffd"
    assert entry["payload_b64"] is None


def test_a_truncated_binary_payload_becomes_replaced_text():
    payload = b"\xff" * (PREVIEW_BYTES + 1)
    entry = build_entry("r-1", payload, {}, 0, 0, max_bytes=PREVIEW_BYTES)
    assert entry["payload_truncated"] is True and entry["payload_b64"] is None
    assert entry["payload_text"] == "\ufffd" * PREVIEW_BYTES


# -- encode / decode round trips ---------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(payload=st.binary(max_size=2048))
def test_any_payload_under_the_limit_comes_back_byte_for_byte_after_storage(payload):
    entry = build_entry("r-1", payload, {}, 0, 0, max_bytes=4096)
    assert entry["payload_bytes"] == len(payload) and entry["payload_truncated"] is False
    assert original_payload(stored(entry)) == payload
    assert (entry["payload_text"] is None) == (entry["payload_b64"] is not None)


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=500))
def test_any_utf8_text_is_kept_as_that_text(text):
    entry = stored(build_entry("r-1", text.encode(), {}, 0, 0))
    assert entry["payload_text"] == text and entry["payload_b64"] is None
    assert original_payload(entry) == text.encode()


def test_a_stored_entry_reads_back_equal():
    payload = b"\x00\xffbinary"
    entry = build_entry("r" * 10_000, payload, dict(FULL_HEADERS), 0, 1)
    assert stored(entry) == entry
    assert stored(entry)["key"] == "r" * 10_000


def test_original_payload_of_a_minimal_entry():
    assert original_payload({}) == b""
    assert original_payload({"payload_text": None, "payload_b64": None}) == b""
    assert original_payload({"payload_text": "héllo"}) == "héllo".encode()
    assert (
        original_payload({"payload_text": "ignored", "payload_b64": base64.b64encode(b"\x01\x02").decode()})
        == b"\x01\x02"
    )
