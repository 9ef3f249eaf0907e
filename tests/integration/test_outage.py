"""A provider outage must not burn requests through the tiers into the DLQ.

The outage lasts 20 s in `make test` (three times every retry delay together) and 60 s
in `make chaos`."""

from __future__ import annotations

import json
import os
import time

from tests.kafka_io import (
    keys_seen,
    produce,
    read_topic,
    request_bytes,
)
from tests.support import MockLLM, http_json, in_state, unique, wait_until

OUTAGE_S = 60 if os.environ.get("CHAOS_FULL") == "1" else 20


def test_an_outage_longer_than_every_retry_delay_costs_no_dead_letters(make_worker, tmp_path):
    mock = MockLLM(tmp_path, args=["--latency-ms", "20"]).start()
    try:
        worker = make_worker(
            env_extra={
                "DLQ_INFERENCE": "openai",
                "DLQ_INFERENCE_URL": mock.api_url,
                "DLQ_INFERENCE_TIMEOUT": "2s",
                "DLQ_RETRY_DELAYS": "1s,2s,3s",
                "DLQ_CONCURRENCY": "16",
                "DLQ_BREAKER": "true",
                "DLQ_BREAKER_OPEN": "2s",
                "DLQ_BREAKER_MAX_OPEN": "8s",
            }
        ).start()
        ids = [unique(f"o{i}") for i in range(2000)]
        produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid)) for rid in ids])
        results, dlq = worker.topic("results"), worker.topic("dlq")
        read_topic(worker.bootstrap, results, lambda r: len(r) >= 200, 120)

        mock.outage(True)
        outage_started = time.monotonic()
        breaker = lambda: next(iter(worker.get("/dlq/stats/")[1]["breaker"].values()))  # noqa: E731
        wait_until(lambda: breaker()["state"] in ("open", "half_open"), 30, "the breaker to open")
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - outage_started)))  # the fault outlasts every tier
        mock.outage(False)

        wanted = set(ids)
        records = read_topic(worker.bootstrap, [results, dlq], lambda r: wanted <= keys_seen(r), 300)
        mine = [r for r in records if r.key.decode() in wanted]
        dead = [r for r in mine if r.topic == dlq]
        assert dead == [], (
            f"{len(dead)} dead letters caused by the outage: {[r.headers.get('error_class') for r in dead[:5]]}"
        )
        assert sorted(r.key.decode() for r in mine) == sorted(ids)  # one result each
        moves = breaker()["moves"]
        for move in ("closed->open", "open->half_open", "half_open->closed"):
            assert moves.get(move, 0) >= 1, moves
        assert breaker()["state"] == "closed"
        assert mock.stats()["by_status"].get("503", 0) > 0
    finally:
        mock.stop()


def test_replayed_dead_letters_failing_for_their_own_reasons_never_open_the_breaker(make_worker):
    """A replay starts again at attempt 1 but has failed before: its 5xx goes back through
    the tiers to the DLQ, and the breaker, which five fresh 5xx in a row would open, stays
    closed, so fresh requests beside the replays are not held."""
    worker = make_worker(
        env_extra={
            "DLQ_SIMULATED_SUCCESS_RATE": "1.0",
            "DLQ_RETRY_DELAYS": "1s",
            "DLQ_BREAKER": "true",
            "DLQ_BREAKER_CONSECUTIVE": "5",
        }
    ).start()
    bad = [unique(f"own{i}") for i in range(10)]
    invalid = {"metadata": {"simulate": {"fail_times": 1, "error": "invalid_request"}}}
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid, **invalid)) for rid in bad])
    wait_until(lambda: worker.get("/dlq/?limit=100")[1].get("total") == len(bad), 60, "every request in the DLQ")

    crashing = {"metadata": {"simulate": {"fail_times": 99, "error": "server_error"}}}  # a prompt the model 500s on
    for rid in bad:
        edited = {**json.loads(request_bytes(rid)), **crashing}
        status, body = http_json(f"{worker.url}/dlq/{rid}/reprocess/", "POST", {"payload": edited})
        assert status == 200 and body["status"] == "reprocessed", body
    fresh = [unique(f"fresh{i}") for i in range(10)]
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid)) for rid in fresh])

    def back_in_the_dlq() -> bool:
        entries = [worker.get(f"/dlq/{rid}/")[1] for rid in bad]
        return all(isinstance(e, dict) and e.get("error_class") == "server_error" for e in entries)

    wait_until(back_in_the_dlq, 90, "every replay back in the DLQ as server_error")
    wait_until(in_state(worker, "succeeded", *fresh), 60, "the fresh requests to succeed")
    breaker = next(iter(worker.get("/dlq/stats/")[1]["breaker"].values()))
    assert breaker["state"] == "closed" and not breaker["moves"].get("closed->open"), breaker
