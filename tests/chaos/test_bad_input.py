"""Bad input of every shape: dead-lettered as invalid_request with its bytes; the worker lives on."""

from __future__ import annotations

import json
import urllib.request
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlqapp.core.requests import MAX_REQUEST_ID_CHARS, InvalidRequest, parse_request
from tests.kafka_io import keys_seen, produce, read_topic, request_bytes
from tests.support import unique, wait_until

LIMIT = 1_048_576


def obj(**fields) -> bytes:
    return json.dumps(fields).encode()


def deep(levels: int) -> bytes:
    return b'{"request_id": "deep", "prompt": "p", "metadata": ' + b'{"a": ' * levels + b"1" + b"}" * levels + b"}"


def corpus() -> list[tuple[str, bytes | None]]:
    """(name, payload) of each bad input; every payload is distinct."""
    n = lambda: uuid.uuid4().hex[:8]  # noqa: E731
    msgs = [{"role": "user", "content": "hi"}]
    return [
        ("not json", b"{not json " + n().encode()),
        ("invalid utf-8", b"\xff\xfe\xfa" + n().encode()),
        ("empty", b""),
        ("null value (tombstone)", None),
        ("json null", b"null"),
        ("array", b"[1, 2, 3]"),
        ("bare number", b"42"),
        ("bare string", b'"hello"'),
        ("bare true", b"true"),
        ("5 MB payload", obj(request_id=f"huge-{n()}", prompt="x" * 5_000_000)),
        ("deep nesting", deep(100_000)),
        ("missing request_id", obj(messages=msgs, tag=n())),
        ("empty request_id", obj(request_id="", messages=msgs, tag=n())),
        ("blank request_id", obj(request_id="   ", messages=msgs, tag=n())),
        ("10k-char request_id", obj(request_id="r" * 10_000, messages=msgs)),
        ("numeric request_id", obj(request_id=12345, messages=msgs, tag=n())),
        ("null request_id", obj(request_id=None, messages=msgs, tag=n())),
        ("object request_id", obj(request_id={"id": 1}, messages=msgs, tag=n())),
        ("lone surrogate request_id", b'{"request_id": "\\ud800' + n().encode() + b'", "prompt": "x"}'),
        ("messages is a string", obj(request_id=f"m1-{n()}", messages="hi")),
        ("messages is empty", obj(request_id=f"m2-{n()}", messages=[])),
        ("message is not an object", obj(request_id=f"m3-{n()}", messages=["hi"])),
        ("unknown role", obj(request_id=f"m4-{n()}", messages=[{"role": "wizard", "content": "x"}])),
        ("content is a number", obj(request_id=f"m5-{n()}", messages=[{"role": "user", "content": 7}])),
        ("neither messages nor prompt", obj(request_id=f"m6-{n()}")),
        ("empty prompt", obj(request_id=f"m7-{n()}", prompt="")),
        ("numeric prompt", obj(request_id=f"m8-{n()}", prompt=3)),
        ("numeric model", obj(request_id=f"m9-{n()}", prompt="x", model=4)),
        ("params is a list", obj(request_id=f"m10-{n()}", prompt="x", params=[1])),
        ("metadata is a string", obj(request_id=f"m11-{n()}", prompt="x", metadata="m")),
        ("utf-8 BOM", b"\xef\xbb\xbf" + obj(request_id=f"bom-{n()}", prompt="x")),
        ("truncated json", obj(request_id=f"t-{n()}", prompt="x")[:-5]),
        ("trailing garbage", obj(request_id=f"g-{n()}", prompt="x") + b" trailing"),
        # lone surrogates where the request is valid otherwise: a model name made /metrics answer 500 for good
        ("lone surrogate model", b'{"request_id": "s1-' + n().encode() + b'", "prompt": "x", "model": "gpt\\ud800"}'),
        ("lone surrogate prompt", b'{"request_id": "s2-' + n().encode() + b'", "prompt": "x\\udfff"}'),
        (
            "lone surrogate metadata",
            b'{"request_id": "s3-' + n().encode() + b'", "prompt": "x", "metadata": {"t": "\\uDBFF"}}',
        ),
        (
            "lone surrogate content",
            b'{"request_id": "s4-' + n().encode() + b'", "messages": [{"role": "user", "content": "\\ud83d"}]}',
        ),
    ]


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker(DLQ_SIMULATED_SUCCESS_RATE="1.0")


def test_every_bad_input_is_dead_lettered_with_its_bytes_and_the_next_valid_one_flows(worker):
    cases = corpus()
    assert len(cases) >= 30
    followers = [unique(f"after-{i}") for i in range(len(cases))]
    messages: list[tuple[bytes | None, bytes | None]] = []
    for (_, payload), follower in zip(cases, followers, strict=True):
        messages += [(b"corpus", payload), (b"corpus", request_bytes(follower))]  # one partition, in order
    produce(worker.bootstrap, worker.topic("input"), messages)
    read_topic(worker.bootstrap, worker.topic("results"), lambda r: set(followers) <= keys_seen(r), 120)
    expected = {payload if payload is not None else b"" for _, payload in cases}
    dead = read_topic(worker.bootstrap, worker.topic("dlq"), lambda r: expected <= {x.value for x in r}, 60)
    by_value = {r.value: r for r in dead}
    for name, payload in cases:
        if payload is None:  # its dead letter's value is empty, like an empty message's: told apart by the header
            record = next((r for r in dead if r.value == b"" and r.headers.get("payload_null") == "true"), None)
            assert record is not None, name
        else:
            record = by_value[payload]
        assert record.headers["error_class"] == "invalid_request", name
        assert record.headers["final_error"].startswith("invalid request:"), name
    assert worker.process.poll() is None, "the worker must survive every bad input"
    for path in ("/metrics", "/dlq/?limit=100", "/dlq/stats/", "/budgets/"):
        with urllib.request.urlopen(worker.url + path, timeout=10) as answer:
            assert answer.status == 200, path
    huge = by_value[cases[9][1]]
    # The dlq agent records the entry after the DLQ topic has the record: wait for it.
    _, entry = wait_until(
        lambda: (r := worker.get(f"/dlq/{huge.key.decode()}/"))[0] == 200 and r, 30, "the 5 MB dead letter's entry"
    )
    assert entry["payload_truncated"] and entry["payload_bytes"] > 5_000_000


def test_odd_but_valid_input_is_processed(worker):
    binary_headers = unique("binary-headers")
    unknown_fields = unique("unknown-fields")
    garbage_key = unique("garbage-key")
    produce(
        worker.bootstrap,
        worker.topic("input"),
        [(binary_headers.encode(), request_bytes(binary_headers))],
        headers=[("x-bin", b"\xff\x00\xfe"), ("replay_count", b"\xff")],
    )
    produce(
        worker.bootstrap,
        worker.topic("input"),
        [(unknown_fields.encode(), request_bytes(unknown_fields, surprise={"nested": [1, 2]}, extra=True))],
    )
    produce(worker.bootstrap, worker.topic("input"), [(b"\xff\xfe\x00", request_bytes(garbage_key))])
    read_topic(
        worker.bootstrap,
        worker.topic("results"),
        lambda r: {binary_headers, unknown_fields, garbage_key} <= keys_seen(r),
        60,
    )
    assert worker.process.poll() is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
request_like = st.fixed_dictionaries(
    {},
    optional={
        "request_id": st.one_of(st.text(max_size=300), json_values),
        "messages": st.one_of(
            st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "x"]), "content": json_values})),
            json_values,
        ),
        "prompt": st.one_of(st.text(max_size=30), json_values),
        "model": json_values,
        "params": json_values,
        "metadata": json_values,
    },
)


@settings(max_examples=400, deadline=None)
@given(request_like)
def test_fuzzed_requests_either_parse_cleanly_or_raise_invalid_request(candidate):
    payload = json.dumps(candidate).encode()
    try:
        request = parse_request(payload, LIMIT)
    except InvalidRequest as exc:
        assert exc.reasons
        return
    assert request.request_id.strip() and len(request.request_id) <= MAX_REQUEST_ID_CHARS
    request.request_id.encode("utf-8")
    assert request.messages or request.prompt
