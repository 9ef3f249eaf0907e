"""The operator HTTP API against a real broker: every route, its errors, replays, discards."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest

from tests.kafka_io import produce, request_bytes
from tests.support import http_json, unique, wait_until


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker(
        DLQ_RETRY_DELAYS="200ms,400ms,600ms",
        DLQ_SIMULATED_SUCCESS_RATE="1.0",
        DLQ_MAX_REPLAYS="2",
        DLQ_MAX_BODY_BYTES="50000",
    )


def dead_letter(worker, error="auth_error", model=None, fail_times=1, **extra) -> str:
    """Produce a request that fails once non-retryably, and wait for its DLQ entry."""
    rid = unique(error)
    body = {"metadata": {"simulate": {"fail_times": fail_times, "error": error}}, **extra}
    if model:
        body["model"] = model
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid, **body))])
    wait_until(lambda: worker.get(f"/dlq/{rid}/")[0] == 200, 30, f"{rid} in the DLQ")
    return rid


def post(worker, path, body=None, raw: bytes | None = None):
    return http_json(worker.url + path, "POST", body, raw=raw)


def test_list_filters_pages_and_counts(worker):
    model = unique("model")
    ids = [dead_letter(worker, "content_filter", model=model) for _ in range(3)]
    status, page = worker.get(f"/dlq/?model={model}&limit=2")
    assert status == 200 and page["total"] == 3 and len(page["items"]) == 2
    status, rest = worker.get(f"/dlq/?model={model}&limit=2&offset=2")
    assert {i["request_id"] for i in page["items"] + rest["items"]} == set(ids)
    assert page["items"][0]["dead_at"] >= page["items"][1]["dead_at"]
    assert worker.get(f"/dlq/?model={model}&error_class=auth_error")[1]["total"] == 0
    assert worker.get(f"/dlq/?q={ids[0]}")[1]["total"] == 1
    assert worker.get(f"/dlq/?model={model}&since=9999999999999")[1]["total"] == 0
    assert worker.get("/dlq/?limit=abc") == (400, {"error": "limit must be an integer, not 'abc'"})
    assert worker.get("/dlq/?limit=0")[0] == 400


def test_entry_shows_payload_headers_history_and_404s_for_unknown_ids(worker):
    rid = dead_letter(worker, "context_length")
    status, entry = worker.get(f"/dlq/{rid}/")
    assert status == 200 and entry["payload"]["request_id"] == rid
    assert entry["headers"]["error_class"] == "context_length" and entry["history"][0]["attempt"] == 1
    assert entry["ledger"] == []
    status, body = worker.get(f"/dlq/{unique('unknown')}/")
    assert status == 404 and "no dead letter" in body["error"]


def test_reprocess_sends_it_back_once_and_records_the_ledger(worker):
    rid = dead_letter(worker, "auth_error")
    status, body = post(worker, f"/dlq/{rid}/reprocess/")
    assert status == 200 and body["status"] == "reprocessed"
    assert post(worker, f"/dlq/{rid}/reprocess/")[0] == 404  # gone from the DLQ: no second replay
    state = wait_until(
        lambda: (s := worker.get(f"/requests/{rid}/")[1]).get("state") == "succeeded" and s, 30, "the replay to succeed"
    )
    (record,) = state["ledger"]
    assert record["action"] == "replay" and record["by"].startswith("api@") and not record["edited"]
    assert worker.get(f"/dlq/{rid}/")[0] == 404


def test_concurrent_replays_of_one_id_give_one_replay(worker):
    rid = dead_letter(worker, "auth_error")  # the replay succeeds, so the id leaves the DLQ for good
    answers = []
    threads = [
        threading.Thread(target=lambda: answers.append(post(worker, f"/dlq/{rid}/reprocess/"))) for _ in range(5)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(status for status, _ in answers) == [200, 404, 404, 404, 404]


def test_edited_payload_is_validated_then_replayed(worker):
    rid = dead_letter(worker, "invalid_request")
    status, body = post(worker, f"/dlq/{rid}/reprocess/", {"payload": {"request_id": rid, "messages": "not a list"}})
    assert status == 400 and any("messages" in r for r in body["reasons"])
    assert post(worker, f"/dlq/{rid}/reprocess/", {"payload": {"request_id": "other", "prompt": "x"}})[0] == 400
    assert worker.get(f"/dlq/{rid}/")[0] == 200  # a refused edit keeps the entry
    status, body = post(worker, f"/dlq/{rid}/reprocess/", {"payload": {"request_id": rid, "prompt": "fixed prompt"}})
    assert status == 200
    state = wait_until(
        lambda: (s := worker.get(f"/requests/{rid}/")[1]).get("state") == "succeeded" and s,
        30,
        "the edited replay to succeed",
    )
    assert state["ledger"][0]["edited"] is True


def test_bad_bodies_are_refused_with_400(worker):
    rid = dead_letter(worker, "auth_error")
    assert post(worker, f"/dlq/{rid}/reprocess/", raw=b"{not json")[0] == 400
    assert post(worker, f"/dlq/{rid}/reprocess/", {"payload": "text"})[0] == 400
    assert post(worker, f"/dlq/{rid}/reprocess/", {"unexpected": 1})[0] == 400
    assert post(worker, "/dlq/reprocess/", {"keys": "not-a-list"})[0] == 400
    assert post(worker, "/dlq/reprocess/", {"keys": [1, 2]})[0] == 400
    assert post(worker, "/dlq/reprocess/", {"all": True, "rate": -1})[0] == 400
    assert post(worker, "/dlq/reprocess/", {})[0] == 400
    assert post(worker, "/dlq/reprocess/", raw=b"[")[0] == 400


def test_oversized_bodies_get_413(worker):
    status, body = post(worker, "/dlq/reprocess/", raw=json.dumps({"keys": ["x" * 60_000]}).encode())
    assert status == 413 and "DLQ_MAX_BODY_BYTES" in body["error"]


def test_replay_cap_stops_loops(worker):
    rid = dead_letter(worker, "auth_error", fail_times=10)
    for _ in range(2):
        assert post(worker, f"/dlq/{rid}/reprocess/")[0] == 200
        wait_until(lambda: worker.get(f"/dlq/{rid}/")[0] == 200, 30, "the replay to fail again")
    status, body = post(worker, f"/dlq/{rid}/reprocess/")
    assert status == 409 and "DLQ_MAX_REPLAYS=2" in body["reason"]
    assert worker.get(f"/dlq/{rid}/")[1]["replay_count"] == 2


def test_bulk_reprocess_by_keys_and_by_filter(worker):
    a, b = dead_letter(worker, "auth_error"), dead_letter(worker, "auth_error")
    missing = unique("missing")
    status, report = post(worker, "/dlq/reprocess/", {"keys": [a, missing]})
    assert status == 200 and report["reprocessed"] == [a] and report["not_found"] == [missing]
    model = unique("bulk-model")
    ids = {dead_letter(worker, "content_filter", model=model) for _ in range(3)}
    status, report = post(worker, "/dlq/reprocess/", {"all": True, "model": model})
    assert status == 200 and set(report["reprocessed"]) == ids
    assert b not in report["reprocessed"]


def test_rate_limited_bulk_replay_reports_progress(worker):
    model = unique("slow-model")
    ids = {dead_letter(worker, "auth_error", model=model) for _ in range(4)}
    status, job = post(worker, "/dlq/reprocess/", {"all": True, "model": model, "rate": 5})
    assert status == 202 and job["total"] == 4
    progress = wait_until(
        lambda: (p := worker.get(job["status_url"])[1])["state"] == "done" and p, 30, "the bulk replay"
    )
    assert set(progress["reprocessed"]) == ids and progress["done"] == 4
    assert progress["finished_at"] - progress["started_at"] >= 600  # 4 replays at 5/s: at least 3 gaps of 200 ms
    assert worker.get("/dlq/replays/nope/")[0] == 404


def test_a_bulk_replay_in_the_background_answers_at_once_and_reports_progress(worker):
    """Thousands of replays take minutes (about 125 a second): an answer at the end outlasted the CLI."""
    model = unique("background-model")
    ids = {dead_letter(worker, "auth_error", model=model) for _ in range(3)}
    assert post(worker, "/dlq/reprocess/", {"all": True, "model": model, "background": "yes"})[0] == 400
    status, job = post(worker, "/dlq/reprocess/", {"all": True, "model": model, "background": True})
    assert status == 202 and job["total"] == 3 and job["rate"] is None
    progress = wait_until(
        lambda: (p := worker.get(job["status_url"])[1])["state"] == "done" and p, 30, "the bulk replay"
    )
    assert set(progress["reprocessed"]) == ids and progress["done"] == 3


def test_discard_removes_the_entry_and_is_recorded(worker):
    rid = dead_letter(worker, "auth_error")
    status, body = http_json(worker.url + f"/dlq/{rid}/", "DELETE")
    assert status == 200 and body["status"] == "discarded"
    assert http_json(worker.url + f"/dlq/{rid}/", "DELETE")[0] == 404
    status, body = worker.get(f"/dlq/{rid}/")
    assert status == 404 and body["ledger"][0]["action"] == "discard"
    assert worker.get(f"/requests/{rid}/")[1]["state"] == "discarded"


def test_stats_count_what_happened(worker):
    before = worker.get("/dlq/stats/")[1]
    rid = dead_letter(worker, "quota_exceeded")
    ok = unique("ok")
    produce(worker.bootstrap, worker.topic("input"), [(ok.encode(), request_bytes(ok))] * 2)
    wait_until(
        lambda: (s := worker.get(f"/requests/{ok}/")[1]).get("duplicates") == 1 and s["state"] == "succeeded",
        30,
        "the duplicate",
    )
    after = worker.get("/dlq/stats/")[1]
    assert after["received"] == before["received"] + 2
    assert after["succeeded"] == before["succeeded"] + 1
    assert after["duplicates_skipped"] == before["duplicates_skipped"] + 1
    assert after["dlq_by_error_class"]["quota_exceeded"] == before["dlq_by_error_class"].get("quota_exceeded", 0) + 1
    assert after["dlq_size"] == before["dlq_size"] + 1 and after["oldest_entry_age_ms"] >= 0
    assert post(worker, f"/dlq/{rid}/reprocess/")[0] == 200
    assert worker.get("/dlq/stats/")[1]["reprocessed"] == after["reprocessed"] + 1


def test_unknown_request_status_is_404(worker):
    assert worker.get(f"/requests/{unique('never')}/")[0] == 404


def test_admin_page_is_served(worker):
    with urllib.request.urlopen(worker.url + "/ui/", timeout=10) as response:
        page = response.read().decode()
    assert response.status == 200 and "<title>dlqapp" in page and "textContent" in page
