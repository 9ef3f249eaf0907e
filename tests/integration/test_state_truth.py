"""Dedup and request state stay true under hostile sequences and replays (issue 13)."""

from __future__ import annotations

import json

import pytest

from tests.kafka_io import (
    keys_seen,
    produce,
    read_topic,
    request_bytes,
)
from tests.support import (
    http_json,
    unique,
    unique_ids,
    wait_until,
)


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker(DLQ_SIMULATED_SUCCESS_RATE="1.0", DLQ_RETRY_DELAYS="200ms,400ms,600ms")


def send(worker, rid: str, value: bytes) -> None:
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), value)])


def state_of(worker, rid: str) -> str | None:
    status, body = worker.get(f"/requests/{rid}/")
    return body.get("state") if status == 200 else None


def calls(worker, rid: str) -> int:
    return worker.get(f"/inference/calls/{rid}/")[1]["calls"]


def dead_letter(worker, rid: str) -> dict:
    return wait_until(
        lambda: (lambda a: a[1] if a[0] == 200 else None)(worker.get(f"/dlq/{rid}/")), 30, f"a dead letter for {rid}"
    )


def test_an_invalid_copy_of_a_succeeded_request_changes_nothing(worker):
    rid = unique("r")
    send(worker, rid, request_bytes(rid))
    wait_until(lambda: state_of(worker, rid) == "succeeded", 30, "the first result")
    send(worker, rid, json.dumps({"request_id": rid}).encode())  # no prompt: invalid
    entry = dead_letter(worker, rid)  # still found by request id
    assert entry["error_class"] == "invalid_request" and entry["request_id"] == rid and entry["key"] != rid
    assert state_of(worker, rid) == "succeeded"
    send(worker, rid, request_bytes(rid))  # the valid one again: a duplicate
    wait_until(lambda: worker.get(f"/requests/{rid}/")[1].get("duplicates", 0) >= 1, 30, "the duplicate to be counted")
    results = read_topic(worker.bootstrap, worker.topic("results"), lambda r: rid in keys_seen(r), 30)
    assert sum(1 for r in results if r.key == rid.encode()) == 1
    assert calls(worker, rid) == 1


def test_an_invalid_copy_never_replaces_a_real_dead_letter(worker):
    rid = unique("dead")
    send(worker, rid, request_bytes(rid, metadata={"simulate": {"fail_times": 5, "error": "auth_error"}}))
    assert dead_letter(worker, rid)["error_class"] == "auth_error"
    send(worker, rid, b'{"request_id": "' + rid.encode() + b'", "prompt": 3}')
    wait_until(
        lambda: any(i["request_id"] == rid and i["key"] != rid for i in worker.get(f"/dlq/?q={rid}")[1]["items"]),
        30,
        "the invalid copy in the list",
    )
    entry = dead_letter(worker, rid)
    assert entry["error_class"] == "auth_error" and entry["key"] == rid  # the real one, payload and history intact
    assert json.loads(entry["payload_text"])["metadata"]["simulate"]["error"] == "auth_error"
    assert state_of(worker, rid) == "dead_lettered"
    copy = next(i for i in worker.get(f"/dlq/?q={rid}")[1]["items"] if i["key"] != rid)
    status, shown = worker.get(f"/dlq/{copy['key']}/")
    assert status == 200 and shown["error_class"] == "invalid_request"
    status, answer = http_json(f"{worker.url}/dlq/{copy['key']}/", "DELETE")
    assert status == 200, answer
    assert dead_letter(worker, rid)["error_class"] == "auth_error"  # discarding the copy left the real one
    assert state_of(worker, rid) == "dead_lettered"


def test_replaying_a_request_that_has_succeeded_since_is_refused_unless_forced(worker):
    rid = unique("since")
    doomed = request_bytes(rid, metadata={"simulate": {"fail_times": 1, "error": "auth_error"}})
    send(worker, rid, doomed)
    dead_letter(worker, rid)
    send(worker, rid, doomed)  # the producer sends it again; this time it goes through
    wait_until(lambda: state_of(worker, rid) == "succeeded", 30, "the re-sent copy to succeed")
    assert calls(worker, rid) == 2
    status, body = http_json(f"{worker.url}/dlq/{rid}/reprocess/", "POST")
    assert status == 409 and "succeeded" in body["reason"] and "force" in body["reason"]
    assert calls(worker, rid) == 2
    status, body = http_json(f"{worker.url}/dlq/reprocess/", "POST", {"keys": [rid]})
    assert status == 200 and body["refused"] == [rid]
    status, body = http_json(f"{worker.url}/dlq/{rid}/reprocess/", "POST", {"force": True})
    assert status == 200 and body["status"] == "reprocessed"
    wait_until(lambda: calls(worker, rid) == 3, 30, "the forced replay to call the model")


def test_a_replay_that_succeeds_at_once_ends_succeeded_not_reprocessed(worker):
    ids = unique_ids("quick", 30)
    produce(
        worker.bootstrap,
        worker.topic("input"),
        [(r.encode(), request_bytes(r, metadata={"simulate": {"fail_times": 1, "error": "auth_error"}})) for r in ids],
    )
    wait_until(lambda: worker.get(f"/dlq/?q={ids[0][:-2]}&limit=100")[1]["total"] >= 30, 60, "30 dead letters")
    status, body = http_json(f"{worker.url}/dlq/reprocess/", "POST", {"keys": ids})
    assert status == 200 and sorted(body["reprocessed"]) == sorted(ids)
    wait_until(lambda: all(state_of(worker, r) == "succeeded" for r in ids), 60, "every replay to succeed")
    assert {state_of(worker, r) for r in ids} == {"succeeded"}  # never left at `reprocessed`
