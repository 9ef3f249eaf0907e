"""Two workers of one app: every read sees the whole DLQ, whichever worker owns it."""

from __future__ import annotations

from tests.support import http_json, produce, request_bytes, unique, wait_until


def test_dlq_reads_on_either_worker_see_every_entry(make_worker):
    env = {"DLQ_RETRY_DELAYS": "200ms,400ms,600ms", "DLQ_SIMULATED_SUCCESS_RATE": "1.0"}
    first = make_worker(env_extra=env).start()
    second = make_worker(app_id=first.app_id, prefix=first.prefix, env_extra=env).start()
    wait_until(lambda: all(w.get("/")[1]["assigned_partitions"] and w.get("/")[1]["ready"] for w in (first, second)), 90, "both workers to own partitions")
    ids = [unique(f"two{i}") for i in range(12)]
    plan = {"metadata": {"simulate": {"fail_times": 1, "error": "auth_error"}}}
    produce(first.bootstrap, first.topic("input"), [(rid.encode(), request_bytes(rid, **plan)) for rid in ids])
    for worker in (first, second):
        page = wait_until(lambda: (p := worker.get("/dlq/?limit=100")[1]).get("total") == 12 and p, 60, f"12 entries listed by {worker.name}")
        assert {i["request_id"] for i in page["items"]} == set(ids) and "incomplete" not in page
        assert all(worker.get(f"/dlq/{rid}/")[0] == 200 for rid in ids)
        assert all(worker.get(f"/requests/{rid}/")[1]["state"] == "dead_lettered" for rid in ids)
        assert worker.get("/dlq/stats/")[1]["dlq_size"] == 12
    owners = {http_json(w.url + "/")[1]["assigned_partitions"] for w in (first, second)}
    assert 0 not in owners  # the work really is split
    shares = [http_json(w.url + "/")[1]["flow"]["rate_limit_share"] for w in (first, second)]
    assert 0 < min(shares) and abs(sum(shares) - 1.0) < 0.001  # each takes its partitions' share of DLQ_RATE_LIMITS
    status, body = http_json(second.url + f"/dlq/{ids[0]}/reprocess/", "POST")
    assert status == 200 and body["status"] == "reprocessed"
    wait_until(lambda: (r := first.get(f"/requests/{ids[0]}/"))[0] == 200 and r[1]["state"] == "succeeded", 120, "the replay to succeed")
