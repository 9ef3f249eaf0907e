"""A new deployment tells the truth from its first second, and after a failover (issue 30).

Every test here starts on topics and an app id nobody used before, with no restart: the
changelogs, the leader and the reply topic are created by the first start itself."""

from __future__ import annotations

import json
import re
import subprocess
from functools import partial

from tests.kafka_io import Record, produce, read_topic, request_bytes
from tests.support import FAUST, Worker, unique_ids, wait_until

NOISE = re.compile(r"\[(ERROR|WARNING|CRITICAL)\]")


def cli(worker: Worker, *args: str) -> dict:
    result = subprocess.run(
        [str(FAUST), "-A", "dlqapp", *args, "--json"],
        env={**worker.env(), "DLQ_WEB_URL": worker.url},
        cwd=worker.tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def outcomes(records: list[Record]) -> tuple[set[bytes], set[bytes]]:
    """(result keys, keys of dead letters still in the DLQ) as the topics say."""
    results = {r.key for r in records if r.topic.endswith("results")}
    dead: dict[bytes, bool] = {}
    for r in records:
        if not r.topic.endswith("results"):
            dead[r.key] = r.value is not None  # the last record of a key wins (compacted)
    return results, {k for k, alive in dead.items() if alive}


def test_the_demo_on_a_new_deployment_counts_right_without_a_restart(make_worker):
    worker = make_worker(env_extra={"DLQ_RETRY_DELAYS": "200ms,400ms,600ms", "DLQ_BREAKER": "true"}).start()
    start_log = worker.log_path.read_text(errors="replace")
    assert not NOISE.findall(start_log), [line for line in start_log.splitlines() if NOISE.search(line)][:5]
    assert (
        "opening partition" not in start_log and "Highwater" not in start_log
    )  # Faust's per-partition detail stays at DEBUG
    for phase in ("topics_ready", "partitions_assigned", "tables_recovered", "ready console="):
        assert phase in start_log, phase
    produced = cli(
        worker, "generate", "--count", "200", "--rate", "100", "--fail-share", "0.1", "--invalid-share", "0.05"
    )
    assert produced["produced"] == 200
    topics = [worker.topic("results"), worker.topic("dlq")]

    # One outcome record each; identical invalid payloads share one dead letter (one key).
    results, dead = outcomes(read_topic(worker.bootstrap, topics, lambda records: len(records) >= 200, 120))
    assert dead and results

    def counts_agree() -> bool:
        stats = worker.get("/dlq/stats/")[1]
        return stats["received"] == 200 and stats["succeeded"] == len(results) and stats["dlq_size"] == len(dead)

    wait_until(
        counts_agree, 30, lambda: f"the stats to say 200 / {len(results)} / {len(dead)}: {worker.get('/dlq/stats/')[1]}"
    )
    assert worker.get("/dlq/?limit=5")[1]["total"] == len(dead)
    assert cli(worker, "dlq-stats")["dlq_size"] == len(dead)
    assert cli(worker, "dlq-list", "--limit", "5")["total"] == len(dead)
    breaker = next(iter(worker.get("/dlq/stats/")[1]["breaker"].values()))
    assert breaker["state"] == "closed" and breaker["moves"] == {}, breaker  # 10 % failing requests are no outage
    noise = [
        line
        for line in worker.log_path.read_text(errors="replace").splitlines()
        if NOISE.search(line) and " dead_letter " not in line
    ]
    assert not noise, noise[:5]  # dead-letter alerts are the only warnings of the run


def test_a_survivor_counts_the_whole_truth_after_a_kill(make_worker):
    env = {"DLQ_SIMULATED_SUCCESS_RATE": "1.0", "DLQ_PARTITIONS": "6"}
    first = make_worker(env_extra=env).start()
    everything = wait_until(
        lambda: first.get("/")[1]["assigned_partitions"], 60, "the first worker to own every partition"
    )
    second = make_worker(app_id=first.app_id, prefix=first.prefix, env_extra=env).start()
    wait_until(
        lambda: all(w.get("/")[1]["assigned_partitions"] for w in (first, second)), 90, "both workers to own partitions"
    )
    doomed, fine = unique_ids("doomed", 40), unique_ids("fine", 40)
    plan = {"metadata": {"simulate": {"fail_times": 9, "error": "invalid_request"}}}
    produce(
        first.bootstrap,
        first.topic("input"),
        [(r.encode(), request_bytes(r, **plan)) for r in doomed] + [(r.encode(), request_bytes(r)) for r in fine],
    )

    def truth(worker: Worker) -> bool:
        stats = worker.get("/dlq/stats/")[1]
        return (
            stats["dlq_size"] == 40
            and stats["succeeded"] == 40
            and stats["received"] == 80
            and worker.get("/dlq/")[1]["total"] == 40
        )

    def counted(worker: Worker) -> str:
        return f"{worker.name} to count 40 dead letters and 40 results: {worker.get('/dlq/stats/')[1]}"

    for worker in (first, second):
        wait_until(partial(truth, worker), 60, partial(counted, worker))
    second.kill()
    wait_until(
        lambda: first.get("/")[1]["assigned_partitions"] == everything, 90, "the survivor to own every partition"
    )
    wait_until(
        lambda: truth(first),
        60,
        lambda: (
            f"the survivor to count the whole truth: {first.get('/dlq/stats/')[1]}, "
            f"total {first.get('/dlq/')[1]['total']}"
        ),
    )
    assert cli(first, "dlq-stats")["dlq_size"] == 40
