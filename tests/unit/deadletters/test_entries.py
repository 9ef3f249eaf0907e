"""dlqapp.deadletters.entries: a DLQ entry built from a `dlq` message, its keys (by request
id, by time, of an unprocessable copy), what the API and lists show, and the original
payload given back byte for byte."""

from __future__ import annotations

import base64
import hashlib
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict

from dlqapp.core.clock import now_ms
from dlqapp.core.partitioning import owner_partition
from dlqapp.deadletters.entries import (
    PREVIEW_BYTES,
    DeadLetterEntry,
    find_dead_letter,
    owner_id,
    time_key,
    unprocessable_key,
)

T0 = 1_700_000_000_000
HISTORY = [
    {"attempt": 1, "at": T0, "topic": "app.input", "error_class": "server_error", "error": "503"},
    {"attempt": 2, "at": T0 + 1000, "topic": "app.retry-1s", "error_class": "auth_error", "error": "401"},
]
FULL_HEADERS = {
    "request_id": "r-1",
    "error_class": "auth_error",
    "final_error": "401 Unauthorized",
    "last_error": "401",
    "retry_count": "1",
    "attempts": "2",
    "attempt_history": json.dumps(HISTORY),
    "original_timestamp": str(T0 - 500),
    "dead_at": str(T0 + 1001),
    "source": json.dumps({"topic": "app.input", "partition": 2, "offset": 17}),
    "replay_count": "3",
}


def position(topic: str, partition: int, offset: int) -> str:
    """What dlqapp.processing.pipeline puts after the class in an unprocessable key."""
    return hashlib.sha256(f"{topic}:{partition}:{offset}".encode()).hexdigest()[:12]


def stored(entry: dict) -> dict:
    """An entry as the recorder writes it to the `dead-letters` table and the API reads it back."""
    return json.loads(json.dumps(entry, separators=(",", ":")).encode())


def build_entry(key: str, payload: bytes, headers: dict, partition: int, offset: int, max_bytes: int | None = None) -> dict:
    """The stored JSON of the entry a `dlq` message makes (`DeadLetterEntry.from_message`, encoded)."""
    return json.loads(DeadLetterEntry.from_message(key, payload, headers, partition, offset, max_bytes).encode())


def typed(entry: dict) -> DeadLetterEntry:
    """A stored entry decoded as the recorder, operator and API read it."""
    return DeadLetterEntry.decode(json.dumps(entry).encode())


def original_payload(entry: dict) -> bytes:
    return typed(entry).original_payload()


def presented(entry: dict) -> dict:
    return typed(entry).presented()


def summary(entry: dict) -> dict:
    return typed(entry).summary()


# -- keys --------------------------------------------------------------------------------


def test_an_unprocessable_key_names_its_request_class_and_position():
    pos = position("app.input", 0, 42)
    assert unprocessable_key("r-1", "invalid_request", pos) == f"r-1~invalid_request~{pos}"
    assert owner_id(unprocessable_key("r-1", "invalid_request", pos)) == "r-1"
    assert owner_id(unprocessable_key("r-1", "poison", pos)) == "r-1"


@pytest.mark.parametrize(
    "request_id",
    [
        "r-1",
        "a~b",  # an id with the separator in it
        "x~poison~000000000000",  # an id that looks like an unprocessable key itself
        "line\nbreak",
        pytest.param("ид-запроса-🙂", id="non-ascii"),
        pytest.param("r" * 10_000, id="10k-chars"),
        "~",
    ],
)
def test_the_owner_of_an_unprocessable_key_is_the_whole_request_id(request_id):
    for error_class in ("invalid_request", "poison"):
        key = unprocessable_key(request_id, error_class, position("app.input", 1, 7))
        assert owner_id(key) == request_id


@pytest.mark.parametrize(
    "key",
    [
        "r-1",
        "",
        "r-1~server_error~0123456789ab",  # not an unprocessable class
        "r-1~invalid_request~0123456789a",  # 11 hex digits
        "r-1~invalid_request~0123456789abc",  # 13
        "r-1~invalid_request~0123456789AB",  # upper-case hex is not what dlqapp writes
        "r-1~poison~0123456789ag",
        "~invalid_request~0123456789ab",  # no request id before it
        "r-1~invalid_request~0123456789ab\n~x",
    ],
)
def test_any_other_key_is_its_own_owner(key):
    assert owner_id(key) == key


def test_a_time_key_is_the_dead_at_as_eight_big_endian_bytes_then_the_key():
    key = time_key(T0, b"r-1")
    assert key[:8] == struct.pack(">Q", T0) and key[8:] == b"r-1"
    assert time_key(1, b"k") == b"\x00" * 7 + b"\x01k"
    assert time_key(-5, b"k") == time_key(0, b"k") == b"\x00" * 8 + b"k"


def test_time_keys_sort_by_time_whatever_the_request_ids():
    keys = [(T0 + 2, b"a"), (T0, b"zzzz"), (T0 + 1, b"\xff" * 300), (255, b"m"), (256, b"b")]
    ordered = sorted(time_key(at, k) for at, k in keys)
    assert [struct.unpack(">Q", k[:8])[0] for k in ordered] == [255, 256, T0, T0 + 1, T0 + 2]


# -- build_entry -------------------------------------------------------------------------


def test_an_entry_carries_every_header_and_the_exact_payload():
    payload = json.dumps({"request_id": "r-1", "model": "gpt-4o-mini", "messages": [{"role": "user", "content": "héllo"}]}).encode()
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
    assert original_payload({"payload_text": "ignored", "payload_b64": base64.b64encode(b"\x01\x02").decode()}) == b"\x01\x02"


# -- what the API shows ------------------------------------------------------------------


def test_presented_parses_json_payloads_and_leaves_the_entry_alone():
    entry = build_entry("r-1", b'{"prompt": "x", "n": [1, 2]}', dict(FULL_HEADERS), 0, 0)
    shown = presented(entry)
    assert shown["payload"] == {"prompt": "x", "n": [1, 2]}
    assert "payload" not in entry
    assert {k: v for k, v in shown.items() if k != "payload"} == entry


@pytest.mark.parametrize(
    "payload, shown",
    [
        (b"{not json", "{not json"),
        (b"plain words", "plain words"),
        (b"42", 42),
        (b"null", None),
        (b"\xff\xfe", None),  # not text: the API shows its base64 instead
    ],
)
def test_presented_shows_text_that_is_not_json_as_text(payload, shown):
    assert presented(build_entry("r-1", payload, {}, 0, 0))["payload"] == shown


def test_presented_survives_a_payload_too_deep_to_parse():
    text = "[" * 100_000 + "]" * 100_000
    assert presented({"payload_text": text})["payload"] == text


def test_summary_lists_the_fields_of_a_list_row_and_a_short_preview():
    text = json.dumps({"request_id": "r-1", "model": "m", "prompt": "p" * 500})
    entry = build_entry("r-1", text.encode(), dict(FULL_HEADERS), 3, 4)
    row = summary(entry)
    assert row == {
        "request_id": "r-1",
        "key": "r-1",
        "error_class": "auth_error",
        "final_error": "401 Unauthorized",
        "last_error": "401",
        "model": "m",
        "attempts": 2,
        "retry_count": 1,
        "replay_count": 3,
        "first_seen": T0 - 500,
        "dead_at": T0 + 1001,
        "payload_preview": text[:160],
    }


def test_a_summary_preview_counts_characters_and_names_binary_payloads():
    assert summary(build_entry("r-1", "é".encode() * 300, {}, 0, 0))["payload_preview"] == "é" * 160
    assert summary(build_entry("r-1", b"short", {}, 0, 0))["payload_preview"] == "short"
    assert summary(build_entry("r-1", b"\xff" * 77, {}, 0, 0))["payload_preview"] == "<77 bytes, not UTF-8>"


def test_a_summary_is_small_whatever_the_payload():
    entry = build_entry("r-1", b"q" * 1_000_000, dict(FULL_HEADERS), 0, 0)
    assert len(json.dumps(summary(entry))) < 1000


# -- find_dead_letter --------------------------------------------------------------------


class Table:
    """The `dead-letters` table as find_dead_letter reads it: `get` by key, and one real
    RocksDB per partition (Faust's store) for the prefix scan."""

    def __init__(self, tmp_path, partitions: int) -> None:
        self.partitions = partitions
        self.dbs = [Rdict(str(tmp_path / f"p{p}"), Options(raw_mode=True)) for p in range(partitions)]
        self.data = self

    def _db_for_partition(self, partition: int) -> Rdict:
        return self.dbs[partition]

    def put(self, key: str, dead_at: int | None) -> None:
        """Stored where dlqapp puts it: on the partition of the key's request id."""
        entry = {"key": key} if dead_at is None else {"key": key, "dead_at": dead_at}
        self.dbs[owner_partition(owner_id(key), self.partitions)][key.encode()] = json.dumps(entry).encode()

    def get(self, key: bytes) -> bytes | None:
        for db in self.dbs:
            value = db.get(key)
            if value is not None:
                return value
        return None

    def close(self) -> None:
        for db in self.dbs:
            db.close()


@pytest.fixture
def table(tmp_path):
    made: list[Table] = []

    def make(partitions: int = 3) -> Table:
        made.append(Table(tmp_path / str(len(made)), partitions))
        return made[-1]

    yield make
    for t in made:
        t.close()


def copy_key(rid: str, error_class: str, offset: int) -> str:
    return unprocessable_key(rid, error_class, position("app.input", 0, offset))


def test_a_request_ids_own_dead_letter_is_found_first(table):
    t = table()
    t.put("r-1", T0)
    t.put(copy_key("r-1", "invalid_request", 1), T0 + 10)  # newer, but only a copy
    assert find_dead_letter(t, "r-1", t.partitions) == b"r-1"


def test_without_its_own_the_newest_unprocessable_copy_is_found(table):
    t = table()
    older, newest, middle = copy_key("r-1", "invalid_request", 1), copy_key("r-1", "poison", 2), copy_key("r-1", "invalid_request", 3)
    t.put(older, T0)
    t.put(newest, T0 + 20)
    t.put(middle, T0 + 10)
    assert find_dead_letter(t, "r-1", t.partitions) == newest.encode()


def test_an_unprocessable_key_is_found_only_exactly(table):
    t = table()
    key = copy_key("r-1", "poison", 1)
    t.put(key, T0)
    assert find_dead_letter(t, key, t.partitions) == key.encode()
    missing = copy_key("r-1", "poison", 2)
    t.put(copy_key(missing, "invalid_request", 3), T0 + 1)  # a copy of a copy: no stand-in for the one asked for
    assert find_dead_letter(t, missing, t.partitions) is None


def test_other_ids_that_share_the_prefix_are_not_taken(table):
    t = table(partitions=1)  # all on one partition, side by side in key order
    t.put("r-1~note", T0 + 30)  # a plain id that starts with "r-1~"
    t.put(copy_key("r-1~note", "invalid_request", 1), T0 + 40)  # a copy of that id
    assert find_dead_letter(t, "r-1", t.partitions) is None
    t.put(copy_key("r-1", "invalid_request", 2), T0)
    assert find_dead_letter(t, "r-1", t.partitions) == copy_key("r-1", "invalid_request", 2).encode()


def test_a_copy_without_a_dead_at_is_still_found(table):
    t = table()
    key = copy_key("r-1", "invalid_request", 1)
    t.put(key, None)
    assert find_dead_letter(t, "r-1", t.partitions) == key.encode()
    dated = copy_key("r-1", "invalid_request", 2)
    t.put(dated, T0)
    assert find_dead_letter(t, "r-1", t.partitions) == dated.encode()


def test_nothing_found_is_none(table):
    t = table()
    t.put("other", T0)
    assert find_dead_letter(t, "r-1", t.partitions) is None


@pytest.mark.parametrize("rid", [pytest.param("r" * 10_000, id="10k-chars"), pytest.param("ид-🙂", id="non-ascii"), "a~b"])
def test_odd_and_very_long_ids_find_their_copies(table, rid):
    t = table(partitions=12)
    key = copy_key(rid, "invalid_request", 9)
    t.put(key, T0)
    assert find_dead_letter(t, rid, t.partitions) == key.encode()
    t.put(rid, T0 - 1)
    assert find_dead_letter(t, rid, t.partitions) == rid.encode()
