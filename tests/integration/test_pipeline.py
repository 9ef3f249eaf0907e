"""The core pipeline against a real broker: tiers, DLQ, dedup, invalid input, TTL; every
result, dead letter and DLQ entry read here is checked against the shipped JSON Schemas."""

from __future__ import annotations

import json
import time

import pytest

from tests.kafka_io import (
    keys_seen,
    produce,
    read_topic,
    request_bytes,
)
from tests.schemas import assert_valid, errors, key_form
from tests.support import unique, wait_until

DELAYS_MS = (300, 600, 900)


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker(
        DLQ_RETRY_DELAYS=",".join(f"{d}ms" for d in DELAYS_MS),
        DLQ_SIMULATED_SUCCESS_RATE="1.0",
        DLQ_MAX_PAYLOAD_BYTES="20000",
    )


def send(worker, *messages, key_by_id=True):
    produce(
        worker.bootstrap,
        worker.topic("input"),
        [((rid.encode() if key_by_id and rid else None), payload) for rid, payload in messages],
    )


def results_for(worker, ids, timeout=60):
    records = read_topic(worker.bootstrap, worker.topic("results"), lambda r: set(ids) <= keys_seen(r), timeout)
    mine = [r for r in records if r.key.decode() in ids]
    for record in mine:
        assert_valid("result", record.json)
    return mine


def dead_letters_for(worker, ids, timeout=60):
    """Dead letters of valid requests: the value is the request's bytes, keyed by its id."""
    records = read_topic(worker.bootstrap, worker.topic("dlq"), lambda r: set(ids) <= keys_seen(r), timeout)
    mine = [r for r in records if r.key.decode() in ids]
    for record in mine:
        assert_valid("input", json.loads(record.value), declared=False)
        assert key_form(record.key.decode()) == "request"
    return mine


def simulate(fail_times, error="server_error", **extra):
    return {"metadata": {"simulate": {"fail_times": fail_times, "error": error, **extra}}}


def assert_never_early(history):
    for attempt in history:
        if attempt["scheduled"] is not None:
            assert attempt["at"] >= attempt["scheduled"], f"attempt {attempt} ran before its scheduled time"


def test_success_after_two_failures_gives_one_result_with_three_attempts_and_three_calls(worker):
    rid = unique("two-failures")
    send(worker, (rid, request_bytes(rid, **simulate(2))))
    (result,) = results_for(worker, [rid])
    body = result.json
    assert body["attempts"] == 3 and body["request_id"] == rid
    assert [a["topic"] for a in body["history"]] == [
        worker.topic("input"),
        worker.topic("retry-300ms"),
        worker.topic("retry-600ms"),
    ]
    assert_never_early(body["history"])
    assert worker.get(f"/inference/calls/{rid}/")[1]["calls"] == 3
    # the result is on the broker a moment before the step that sent it records the state
    state = wait_until(
        lambda: (s := worker.get(f"/requests/{rid}/")[1]).get("state") == "succeeded" and s,
        30,
        "the request's state to read succeeded",
    )
    assert state["attempts"] == 3


def test_tier_messages_carry_the_contract_headers(worker):
    rid = unique("headers")
    send(worker, (rid, request_bytes(rid, **simulate(1, "timeout"))))
    results_for(worker, [rid])
    (tier_message,) = [
        r
        for r in read_topic(worker.bootstrap, worker.topic("retry-300ms"), lambda r: rid in keys_seen(r), 30)
        if r.key.decode() == rid
    ]
    h = tier_message.headers
    assert h["retry_count"] == "1" and h["error_class"] == "timeout" and "simulated timeout" in h["last_error"]
    assert int(h["scheduled_time"]) >= int(h["original_timestamp"]) + 300
    assert tier_message.value == request_bytes(rid, **simulate(1, "timeout"))


def test_four_failures_reach_the_dlq_with_final_error_and_full_history(worker):
    rid = unique("always-fails")
    payload = request_bytes(rid, **simulate(9, "server_error"))
    send(worker, (rid, payload))
    (dead,) = dead_letters_for(worker, [rid])
    assert dead.value == payload
    assert dead.headers["retry_count"] == "3" and dead.headers["error_class"] == "server_error"
    assert "gave up after 4 attempts" in dead.headers["final_error"]
    history = json.loads(dead.headers["attempt_history"])
    assert [a["attempt"] for a in history] == [1, 2, 3, 4]
    assert_never_early(history)
    # the dead letter is confirmed on the broker before the state is written: wait for it
    wait_until(
        lambda: worker.get(f"/requests/{rid}/")[1]["state"] == "dead_lettered", 30, "the state to say dead_lettered"
    )


def test_a_non_retryable_class_is_dead_lettered_after_one_attempt(worker):
    rid = unique("auth")
    send(worker, (rid, request_bytes(rid, **simulate(5, "auth_error"))))
    (dead,) = dead_letters_for(worker, [rid])
    assert dead.headers["error_class"] == "auth_error" and dead.headers["retry_count"] == "0"
    assert len(json.loads(dead.headers["attempt_history"])) == 1
    assert worker.get(f"/inference/calls/{rid}/")[1]["calls"] == 1


def test_rate_limit_retry_after_delays_the_next_attempt_beyond_the_tier(worker):
    rid = unique("rate-limited")
    send(worker, (rid, request_bytes(rid, **simulate(1, "rate_limited", retry_after=3))))
    (result,) = results_for(worker, [rid])
    first, second = result.json["history"]
    assert second["scheduled"] >= first["at"] + first["duration_ms"] + 3000
    assert second["at"] >= second["scheduled"]


@pytest.mark.parametrize(
    "payload, reason",
    [
        (b"{not json", "not valid JSON"),
        (b'{"messages": [{"role": "user", "content": "no id"}]}', "request_id"),
        (b'{"request_id": 42, "prompt": ["wrong", "types"]}', "request_id"),
        (b"\xff\x00\xfe binary", "UTF-8"),
        (json.dumps({"request_id": "big", "prompt": "x" * 30_000}).encode(), "over the 20000-byte limit"),
    ],
)
def test_invalid_input_is_dead_lettered_at_once_with_its_bytes_and_the_next_message_flows(worker, payload, reason):
    follower = unique("after-bad")
    produce(worker.bootstrap, worker.topic("input"), [(None, payload), (None, request_bytes(follower))])
    results_for(worker, [follower])
    dead = read_topic(worker.bootstrap, worker.topic("dlq"), lambda rs: any(r.value == payload for r in rs), 30)
    (record,) = [r for r in dead if r.value == payload][:1]
    assert record.headers["error_class"] == "invalid_request" and reason in record.headers["final_error"]
    readable_id = reason.startswith("over the")  # the oversized one has an id; the others have none
    assert key_form(record.key.decode()) == ("unprocessable copy" if readable_id else "invalid without id")
    try:
        doc = json.loads(payload)
    except ValueError:
        doc = None
    if doc is not None and not readable_id:
        assert errors("input", doc), "the input schema accepts a payload dlqapp refused"


def test_the_same_id_three_times_keyed_and_unkeyed_is_called_once(worker):
    rid = unique("dup")
    payload = request_bytes(rid)
    send(worker, (rid, payload))
    send(worker, (rid, payload), key_by_id=False)
    send(worker, (rid, payload))
    results_for(worker, [rid])
    wait_until(lambda: worker.get(f"/requests/{rid}/")[1].get("duplicates") == 2, 30, "two duplicates to be counted")
    assert len(results_for(worker, [rid])) == 1
    assert worker.get(f"/inference/calls/{rid}/")[1]["calls"] == 1


def test_a_request_older_than_the_ttl_is_dead_lettered_as_expired_without_a_call(worker):
    rid = unique("stale")
    payload = request_bytes(rid)
    two_days_ago = int(time.time() * 1000) - 2 * 86_400_000
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), payload)], timestamp_ms=two_days_ago)
    (dead,) = dead_letters_for(worker, [rid])
    assert dead.headers["error_class"] == "expired" and "DLQ_MAX_AGE" in dead.headers["final_error"]
    assert dead.value == payload
    assert worker.get(f"/inference/calls/{rid}/")[1]["calls"] == 0


def test_the_dlq_agent_records_the_entry_the_json_line_and_the_alert(worker):
    rid = unique("recorded")
    payload = request_bytes(rid, **simulate(1, "content_filter"))
    send(worker, (rid, payload))
    entry = wait_until(lambda: (r := worker.get(f"/dlq/{rid}/"))[0] == 200 and r[1], 30, "the DLQ entry")
    assert entry["error_class"] == "content_filter" and entry["payload"]["request_id"] == rid
    assert entry["payload_bytes"] == len(payload) and len(entry["history"]) == 1
    assert entry["source"]["topic"] == worker.topic("input") and entry["dead_at"] >= entry["first_seen"]
    assert_valid("dead-letter", entry)
    log = worker.data_dir / "dead-letters.jsonl"  # appended on a thread of its own: soon, not at once
    log_lines = wait_until(
        lambda: log.exists() and rid in (text := log.read_text()) and text.splitlines(), 10, "the line"
    )
    assert [json.loads(line)["error_class"] for line in log_lines if rid in line] == ["content_filter"]
    for line in log_lines:
        assert_valid("dead-letter", json.loads(line))
    (alert,) = [line for line in worker.log_path.read_text().splitlines() if f"dead_letter request_id={rid} " in line]
    assert "WARNING" in alert and "error_class=content_filter" in alert and "attempt=1" in alert
    assert worker.get(f"/dlq/{unique('nope')}/")[0] == 404
