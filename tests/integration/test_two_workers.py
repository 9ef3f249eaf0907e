"""Two workers of one app: every read sees the whole DLQ and every parked retry, whichever
worker owns it, and actions on either worker run on the owner."""

from __future__ import annotations

import json
import signal
import subprocess

from dlqapp.core.partitioning import owner_partition
from tests.kafka_io import produce, request_bytes, topics_named
from tests.support import Worker, http_json, in_state, page_with_total, unique, wait_until


def test_dlq_reads_on_either_worker_see_every_entry(make_worker):
    first, second = _two_workers(make_worker, {"DLQ_RETRY_DELAYS": "10m,20m", "DLQ_SIMULATED_SUCCESS_RATE": "1.0"})
    ids = _failing_once(first, "two", 12, "auth_error")
    for worker in (first, second):
        page = wait_until(page_with_total(worker, "/dlq/?limit=100", 12), 60, f"12 entries listed by {worker.name}")
        assert {i["request_id"] for i in page["items"]} == set(ids) and "incomplete" not in page
        assert all(worker.get(f"/dlq/{rid}/")[0] == 200 for rid in ids)
        wait_until(in_state(worker, "dead_lettered", *ids), 30, "every state to say dead_lettered")
        assert worker.get("/dlq/stats/")[1]["dlq_size"] == 12
    owners = {http_json(w.url + "/")[1]["assigned_partitions"] for w in (first, second)}
    assert 0 not in owners  # the work really is split
    shares = [http_json(w.url + "/")[1]["flow"]["rate_limit_share"] for w in (first, second)]
    assert min(shares) > 0 and abs(sum(shares) - 1.0) < 0.001  # each takes its partitions' share of DLQ_RATE_LIMITS
    status, body = http_json(second.url + f"/dlq/{ids[0]}/reprocess/", "POST")
    assert status == 200 and body["status"] == "reprocessed"
    answers: list[tuple[int, object]] = []

    def replayed() -> bool:
        answers.append(first.get(f"/requests/{ids[0]}/"))
        status, body = answers[-1]
        return status == 200 and isinstance(body, dict) and body["state"] == "succeeded"

    wait_until(replayed, 120, lambda: f"the replay to succeed (first answer {answers[0]}, last {answers[-1]})")

    # parked retries: listed by both workers, run now / dead-lettered through either one
    parked = [unique(f"park{i}") for i in range(6)]
    retry_plan = {"metadata": {"simulate": {"fail_times": 1, "error": "unknown"}}}
    produce(first.bootstrap, first.topic("input"), [(rid.encode(), request_bytes(rid, **retry_plan)) for rid in parked])
    for worker in (first, second):
        listing = wait_until(
            page_with_total(worker, "/retries/?limit=100", 6), 60, f"6 parked retries listed by {worker.name}"
        )
        assert {i["request_id"] for i in listing["items"]} == set(parked) and "incomplete" not in listing
        assert len(worker.get("/health/")[1]["workers"]) == 2
    for n, rid in enumerate(parked[:5]):
        via = (first, second)[n % 2]
        status, body = http_json(via.url + f"/retries/{rid}/run-now/", "POST", {})
        assert status == 200 and body["status"] == "fired", body
    status, body = http_json(first.url + f"/retries/{parked[5]}/dead-letter/", "POST", {})
    assert status == 200 and body["status"] == "dead_lettered", body
    for rid in parked[:5]:
        wait_until(in_state(second, "succeeded", rid), 120, f"{rid} run now")
    # the dlq agent records the entry once it reads the dead letter (committed) back
    wait_until(lambda: second.get(f"/dlq/{parked[5]}/")[0] == 200, 30, "the dead letter listed on the other worker")
    wait_until(lambda: second.get("/retries/")[1]["total"] == 0, 120, "no parked retry left")


def test_a_worker_that_asked_another_for_operator_actions_stops_promptly_and_leaves_no_topic(make_worker):
    """Every action through a worker that does not own the request is an `ask()` whose reply
    comes back on the asking worker's reply topic: those replies must never hold up its
    shutdown (or a rebalance) waiting to be acked. A clean stop deletes that topic (each
    start makes a new one), and an answer owed to a worker gone since is dropped: the
    command still runs, and the topic is not brought back."""
    first, second = _two_workers(make_worker, {"DLQ_SIMULATED_SUCCESS_RATE": "1.0"})
    reply_prefix = f"{first.app_id}-reply-"
    replies_before = topics_named(first.bootstrap, reply_prefix)
    assert len(replies_before) == 2  # one per worker
    ids = _failing_once(first, "ask", 8, "invalid_request")
    wait_until(lambda: second.get("/dlq/?limit=100")[1].get("total") == len(ids), 60, "every request in the DLQ")
    for rid in ids[:4]:
        status, body = http_json(second.url + f"/dlq/{rid}/reprocess/", "POST")
        assert status == 200 and body["status"] == "reprocessed", body
    for rid in ids[4:]:
        status, body = http_json(second.url + f"/dlq/{rid}/", "DELETE")
        assert status == 200 and body["status"] == "discarded", body
    for rid in ids[:4]:
        wait_until(in_state(second, "succeeded", rid), 60, f"{rid} replayed")

    second.process.send_signal(signal.SIGTERM)
    try:
        code = second.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the worker did not stop within 60 s of SIGTERM:\n{second.log_tail()}") from None
    assert code == 0, second.log_tail()
    assert "wait_empty: Waiting for tasks" not in second.log_path.read_text(errors="replace")
    assert "reply_topic_left" not in second.log_path.read_text(errors="replace"), second.log_tail()
    (left,) = topics_named(first.bootstrap, reply_prefix)  # the first worker's own
    (gone,) = replies_before - {left}  # the second's, which the first has answered on

    # a discard asked by a worker that has stopped since: carried out, its answer dropped
    (late,) = _failing_once(first, "late", 1, "invalid_request")
    wait_until(lambda: first.get(f"/dlq/{late}/")[0] == 200, 60, "the late request in the DLQ")
    command = {"action": "discard", "request_id": late, "actor": "test"}
    ask_headers = [("Faust-Ag-ReplyTo", gone.encode()), ("Faust-Ag-CorrelationId", b"c-1")]
    produce(
        first.bootstrap,
        first.topic("dlqapp-commands"),
        [(late.encode(), json.dumps(command).encode())],
        headers=ask_headers,
        partition=owner_partition(late, 3),
    )
    wait_until(lambda: first.get(f"/dlq/{late}/")[0] == 404, 60, "the discard carried out")
    wait_until(
        lambda: f"answer_dropped reply_to={gone}" in first.log_path.read_text(errors="replace"),
        30,
        "the answer dropped",
    )
    assert topics_named(first.bootstrap, reply_prefix) == {left}


def _two_workers(make_worker, env: dict[str, str]) -> tuple[Worker, Worker]:
    """Two workers of one app, each owning partitions."""
    first = make_worker(env_extra=env).start()
    second = make_worker(app_id=first.app_id, prefix=first.prefix, env_extra=env).start()
    wait_until(
        lambda: all(w.get("/")[1]["assigned_partitions"] and w.get("/")[1]["ready"] for w in (first, second)),
        90,
        "both workers to own partitions",
    )
    return first, second


def _failing_once(worker: Worker, prefix: str, count: int, error: str) -> list[str]:
    """`count` requests whose first attempt fails with `error`, produced to `input`; their ids."""
    ids = [unique(f"{prefix}{i}") for i in range(count)]
    plan = {"metadata": {"simulate": {"fail_times": 1, "error": error}}}
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid, **plan)) for rid in ids])
    return ids
