"""`faust -A dlqapp grow-partitions`: a stopped deployment moves to more partitions and
keeps its dedup state, its dead letters and its parked retries."""

from __future__ import annotations

import json
import subprocess

from tests.kafka_io import produce, read_topic, request_bytes
from tests.support import FAUST, unique_ids, wait_until

RETRY_DELAY_S = 20


def grow(worker, to: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FAUST), "-A", "dlqapp", "grow-partitions", "--to", str(to), "--json"],
        env=worker.env(),
        cwd=worker.tmp,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_stopped_deployment_grows_to_more_partitions_with_its_state(make_worker):
    env = {"DLQ_RETRY_DELAYS": f"{RETRY_DELAY_S}s", "DLQ_SIMULATED_SUCCESS_RATE": "1.0"}
    old = make_worker(env_extra=env).start()
    succeeded, dead, parked = unique_ids("ok", 30), unique_ids("dead", 20), unique_ids("park", 20)
    plan = lambda error: {"metadata": {"simulate": {"fail_times": 1, "error": error}}}  # noqa: E731
    produce(
        old.bootstrap,
        old.topic("input"),
        [(rid.encode(), request_bytes(rid)) for rid in succeeded]
        + [(rid.encode(), request_bytes(rid, **plan("auth_error"))) for rid in dead]
        + [(rid.encode(), request_bytes(rid, **plan("server_error"))) for rid in parked],
    )
    wait_until(
        lambda: old.get("/dlq/stats/")[1].get("dlq_size") == 20 and old.get("/retries/?limit=1")[1].get("total") == 20,
        60,
        "20 dead letters and 20 parked retries",
    )
    wait_until(
        lambda: all(old.get(f"/requests/{rid}/")[1].get("state") == "succeeded" for rid in succeeded),
        60,
        "30 successes",
    )

    refused = grow(old, 8)
    assert refused.returncode == 2 and "live member" in refused.stderr, refused.stderr
    old.stop()
    grown = grow(old, 8)
    assert grown.returncode == 0, grown.stderr
    report = json.loads(grown.stdout)
    assert report["partitions_after"] == 8 and old.topic("input") in report["topics_grown"]
    assert (
        report["entries_moved"]["requests"] > 0
        and report["entries_moved"]["dead-letters"] > 0
        and report["entries_moved"]["parked-retries"] > 0
    )

    new = make_worker(app_id=old.app_id, prefix=old.prefix, env_extra={**env, "DLQ_PARTITIONS": "8"}).start()
    page = new.get("/dlq/?limit=100")[1]
    assert page["total"] == 20 and {i["request_id"] for i in page["items"]} == set(dead)
    assert all(new.get(f"/dlq/{rid}/")[0] == 200 for rid in dead)
    assert all(new.get(f"/requests/{rid}/")[1].get("state") == "succeeded" for rid in succeeded)
    assert new.get("/dlq/stats/")[1]["dlq_size"] == 20

    # Dedup survived: the same requests again are duplicates, not new calls.
    produce(new.bootstrap, new.topic("input"), [(rid.encode(), request_bytes(rid)) for rid in succeeded])
    wait_until(
        lambda: all(new.get(f"/requests/{rid}/")[1].get("duplicates", 0) >= 1 for rid in succeeded),
        60,
        "the repeats counted as duplicates",
    )
    # The parked retries fire on their new partitions and succeed (one planned failure each).
    wait_until(
        lambda: all(new.get(f"/requests/{rid}/")[1].get("state") == "succeeded" for rid in parked),
        RETRY_DELAY_S + 60,
        "the parked retries to succeed",
    )
    results = read_topic(
        new.bootstrap, new.topic("results"), lambda records: len(records) >= 50, timeout=30, partitions=8
    )
    outcomes = [r.key.decode() for r in results]
    assert sorted(outcomes) == sorted(succeeded + parked), "each request has exactly one result"
