"""Bounded state: settled states are forgotten after DLQ_STATE_RETENTION, not before."""

from __future__ import annotations

import pytest

from tests.kafka_io import (
    keys_seen,
    produce,
    read_topic,
    request_bytes,
)
from tests.support import unique, wait_until


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker(
        DLQ_SIMULATED_SUCCESS_RATE="1.0", DLQ_STATE_RETENTION="8s", DLQ_LOG_MAX_BYTES="4000", DLQ_LOG_BACKUPS="2"
    )


def test_dedup_holds_inside_the_retention_window_and_the_sweep_forgets_after_it(worker):
    rid = unique("kept")
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid))])
    wait_until(lambda: worker.get(f"/requests/{rid}/")[1].get("state") == "succeeded", 30, "the result")
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid))])  # within the window
    wait_until(lambda: worker.get(f"/requests/{rid}/")[1].get("duplicates") == 1, 30, "the duplicate to be skipped")
    assert worker.get(f"/inference/calls/{rid}/")[1]["calls"] == 1
    wait_until(lambda: worker.get(f"/requests/{rid}/")[0] == 404, 60, "the settled state to be swept")
    stats = worker.get("/dlq/stats/")[1]
    assert stats["received"] >= 1 and stats["succeeded"] >= 1  # the counts outlive the states
    produce(
        worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid))]
    )  # past the window: a new request
    wait_until(lambda: worker.get(f"/inference/calls/{rid}/")[1]["calls"] == 2, 30, "the id to be served again")


def test_a_dead_letter_state_is_kept_while_it_is_in_the_dlq(worker):
    rid = unique("dead")
    produce(
        worker.bootstrap,
        worker.topic("input"),
        [(rid.encode(), request_bytes(rid, metadata={"simulate": {"fail_times": 9, "error": "auth_error"}}))],
    )
    wait_until(lambda: worker.get(f"/dlq/{rid}/")[0] == 200, 30, "the dead letter")
    gone = unique("gone")
    produce(worker.bootstrap, worker.topic("input"), [(gone.encode(), request_bytes(gone))])
    wait_until(lambda: worker.get(f"/requests/{gone}/")[0] == 404, 60, "a later settled state to be swept")
    assert worker.get(f"/requests/{rid}/")[1]["state"] == "dead_lettered"


def test_the_dead_letter_log_rotates(worker):
    ids = [unique("log") for _ in range(12)]
    produce(
        worker.bootstrap,
        worker.topic("input"),
        [(r.encode(), request_bytes(r, metadata={"simulate": {"fail_times": 9, "error": "auth_error"}})) for r in ids],
    )
    read_topic(worker.bootstrap, worker.topic("dlq"), lambda r: set(ids) <= keys_seen(r), 60)
    log = worker.data_dir / "dead-letters.jsonl"
    wait_until(lambda: (worker.data_dir / "dead-letters.jsonl.1").exists(), 30, "a rotated log")
    assert not (worker.data_dir / "dead-letters.jsonl.3").exists()  # DLQ_LOG_BACKUPS=2
    assert (not log.exists()) or log.stat().st_size < 4000 + 10_000
