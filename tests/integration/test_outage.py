"""A provider outage must not burn requests through the tiers into the DLQ.

The outage lasts 20 s in `make test` (three times every retry delay together) and 60 s
in `make chaos`."""

from __future__ import annotations

import os
import time

from tests.kafka_io import (
    keys_seen,
    produce,
    read_topic,
    request_bytes,
)
from tests.support import MockLLM, unique, wait_until

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
