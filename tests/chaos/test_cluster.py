"""No request is lost when brokers of a three-broker cluster die (replication factor 3,
min.insync.replicas 2, acks=all): leaders killed -9, a rolling restart under load, workers
killed while a broker is down.

One cluster (the session's `kafka_cluster`) serves every scenario; each scenario starts
with all three brokers up. `make test` runs the leader kill at a reduced size and starts a
worker while each broker in turn is down (a broker
restart costs 10-20 s here, a rolling restart a minute); CHAOS_CLUSTER=1 adds the other
three at reduced sizes, and `make chaos` (CHAOS_FULL=1) runs all four at full size. Each
prints its ledger summary and "recover_s", the longest time a partition with requests
left went without a new outcome.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from tests.chaos.cluster_tools import StallMeter, SteadyLoad, ids_per_partition
from tests.chaos.ledger import FULL, Ledger, under_exactly_once
from tests.chaos.test_faults import FAULT_ENV, mock_calls, produce_ids, report, start_mock
from tests.cluster import LocalCluster, wait_in_sync
from tests.support import MockLLM, Worker, Workers, unique, unique_ids, wait_until

PARTITIONS = 3
ALL = FULL or os.environ.get("CHAOS_CLUSTER") == "1"
every_scenario = pytest.mark.skipif(not ALL, reason="CHAOS_CLUSTER=1 or CHAOS_FULL=1 (make chaos) runs it")
pytestmark = pytest.mark.timeout(2400 if FULL else 900)
# calls a rebalance or crash can orphan per worker: concurrency x window factor (4 under
# exactly_once, which also waits for commits) x agents
WINDOW = 64 * 4 * 2


class Run:
    """One scenario: the cluster, a mock LLM, workers sharing an app id, their ledger."""

    def __init__(self, cluster: LocalCluster, tmp_path, mock: MockLLM, **env: str) -> None:
        self.cluster, self.tmp_path, self.mock = cluster, tmp_path, mock
        self.app_id = unique("app")
        self.env = {**FAULT_ENV, "DLQ_INFERENCE_URL": mock.api_url, "DLQ_REPLICATION_FACTOR": "3", **env}
        self.workers: list[Worker] = []

    def worker(self, wait: bool = True) -> Worker:
        worker = Workers(self.cluster.bootstrap, self.tmp_path).make(
            app_id=self.app_id,
            name=f"w{len(self.workers) + 1}",
            env_extra=self.env,
        )
        self.workers.append(worker)
        return worker.start(wait=wait)

    def topic(self, name: str) -> str:
        return f"{self.app_id}.{name}"

    def meter(self, ids: list[str]) -> StallMeter:
        meter = StallMeter(
            self.cluster.bootstrap, (self.topic("results"), self.topic("dlq")), ids_per_partition(ids, PARTITIONS)
        )
        meter.start()
        return meter

    @property
    def exactly_once(self) -> bool:
        return under_exactly_once({**os.environ, **self.env})

    def ledger(self, ids: list[str], timeout: float = 600) -> Ledger:
        """Every outcome a read_committed consumer sees, once each id has one and the topics are quiet."""
        return Ledger.read_settled(
            self.cluster.bootstrap, self.topic("results"), self.topic("dlq"), ids, timeout, PARTITIONS
        )

    def busiest_input_leader(self) -> tuple[int, int]:
        """(partition of `input` with the most messages, the broker leading it)."""
        ends = self.cluster.end_offsets(self.topic("input"), PARTITIONS)
        busiest = max(ends, key=lambda p: ends[p])
        return busiest, self.cluster.leaders(self.topic("input"))[busiest]

    def close(self) -> None:
        for worker in self.workers:
            worker.kill()


@pytest.fixture
def run(kafka_cluster: LocalCluster, tmp_path) -> Iterator:
    """A scenario factory; all three brokers are up before and after each scenario."""
    kafka_cluster.run("start")
    mock = start_mock(tmp_path)
    runs: list[Run] = []

    def make(**env: str) -> Run:
        runs.append(Run(kafka_cluster, tmp_path, mock, **env))
        return runs[-1]

    try:
        yield make
    finally:
        for r in runs:
            r.close()
        mock.stop()
        kafka_cluster.run("start", check=False)


def check(name: str, r: Run, ledger: Ledger, faults: str, recover_s: float, crashes: int) -> dict:
    summary = {**ledger.summary(r.mock.url), "faults": faults, "recover_s": recover_s}
    report(name, summary)
    assert ledger.lost == [], summary
    assert summary["mixed_outcomes"] == 0, summary
    if r.exactly_once:
        assert summary["duplicate_outcomes"] == 0, summary
    assert summary["extra_calls"] <= crashes * WINDOW, summary
    return summary


def test_kill_9_the_leader_of_the_busiest_input_partition_mid_run(run):
    count = 20_000 if FULL else 600
    r = run()
    worker = r.worker()
    ids = produce_ids(worker, count, "leader")
    wait_until(lambda: mock_calls(r.mock) >= count // 3, 300, "a third of the run")
    partition, leader = r.busiest_input_leader()
    meter = r.meter(ids)
    r.cluster.kill(leader)
    killed_at = time.monotonic()
    wait_until(lambda: meter.flowing_since(killed_at), 120, "every partition flowing again without the broker")
    restart = r.cluster.start_broker_later(leader)
    ledger = r.ledger(ids)
    recover_s = meter.stop()
    assert restart.wait(timeout=300) == 0, restart.stdout.read()
    check(
        "cluster: kill -9 the busiest input partition's leader",
        r,
        ledger,
        f"broker {leader} (leader of input-{partition}) killed, restarted",
        recover_s,
        crashes=1,
    )
    assert worker.process.poll() is None, "the worker rides out the broker's death"


def test_a_worker_starts_while_any_one_broker_is_down(run):
    """At start Faust declares its topics through the first broker its client lists, and
    sends the creation to the controller the metadata names: a broker killed and not yet
    fenced made the worker exit (NodeNotReadyError) when it was either. Each broker in turn
    is down while a worker starts; each must come up and serve."""
    r = run()
    r.worker().kill()  # the topics exist: what follows is a restart, as in production
    for broker in (1, 2, 3):
        r.cluster.kill(broker)
        try:
            worker = r.worker()
            ids = produce_ids(worker, 20, f"down{broker}")
            ledger = r.ledger(ids, timeout=180)
            assert ledger.lost == [], f"broker {broker} down: {ledger.summary(r.mock.url)}"
            worker.kill()
        finally:
            r.cluster.start_broker(broker)
        wait_in_sync(r.cluster, r.app_id)


@every_scenario
def test_kill_9_the_broker_leading_parked_retries_while_retries_are_parked(run):
    """The worker is killed right after the broker, and a fresh one (empty data dir) takes
    over: every parked retry must come back from the changelog's surviving replicas."""
    count = 10_000 if FULL else 600
    # Retries parked at a time ~ results/s x 20% failing x the first delay: at full size the
    # delays are longer so that hundreds are parked when the broker dies (2 s parked ~40).
    r = run(DLQ_RETRY_DELAYS="10s,20s,30s" if FULL else "2s,4s,6s")
    first = r.worker()
    ids = produce_ids(first, count, "parked")
    wait_until(
        lambda: first.get("/retries/?limit=1")[1]["total"] >= min(200, max(20, count // 20)), 300, "retries parked"
    )
    leaders = r.cluster.leaders(f"{r.app_id}-parked-retries-changelog")
    broker, led = Counter(leaders.values()).most_common(1)[0]
    meter = r.meter(ids)
    r.cluster.kill(broker)
    parked = first.get("/retries/?limit=1")[1]["total"]
    first.kill()
    second = r.worker()
    restart = r.cluster.start_broker_later(broker)
    ledger = r.ledger(ids)
    recover_s = meter.stop()
    assert restart.wait(timeout=300) == 0, restart.stdout.read()
    check(
        "cluster: kill -9 the parked-retries changelog leader",
        r,
        ledger,
        f"broker {broker} (leader of {led} of 3 changelog partitions, {parked} retries parked) and the worker killed",
        recover_s,
        crashes=1,
    )
    assert second.process.poll() is None


@every_scenario
def test_a_rolling_restart_of_all_three_brokers_under_load(run):
    rate = 150 if FULL else 40
    r = run()
    worker = r.worker()
    load = SteadyLoad(r.cluster.bootstrap, r.topic("input"), unique_ids("rolling", rate * 900), rate)
    load.start()
    try:
        wait_until(lambda: mock_calls(r.mock) >= rate * 2, 120, "the load flowing")
        meter = r.meter(load.ids)
        for broker in (1, 2, 3):
            r.cluster.stop_broker(broker)
            r.cluster.start_broker(broker)
            wait_in_sync(r.cluster, r.app_id)
    finally:
        load.halt()
    sent = load.finish()
    meter.expected = ids_per_partition(sent, PARTITIONS)
    ledger = r.ledger(sent)
    recover_s = meter.stop()
    check(
        "cluster: rolling restart under load",
        r,
        ledger,
        f"3 brokers restarted one by one at {rate} requests/s",
        recover_s,
        crashes=3,
    )
    assert worker.process.poll() is None


@every_scenario
def test_two_workers_killed_while_a_broker_is_down(run):
    count = 20_000 if FULL else 1_500
    r = run()
    workers = [r.worker(wait=False) for _ in range(3)]
    for w in workers:
        w.wait_ready()
    wait_until(
        lambda: all(w.get("/")[1]["assigned_partitions"] for w in workers), 120, "three workers sharing the partitions"
    )
    ids = produce_ids(workers[0], count, "two")
    wait_until(lambda: mock_calls(r.mock) >= count // 3, 300, "a third of the run")
    _, leader = r.busiest_input_leader()
    meter = r.meter(ids)
    r.cluster.kill(leader)
    for victim in workers[:2]:
        victim.kill()
    for victim in workers[:2]:
        victim.start(wait=False)  # while the broker is still down
    for victim in workers[:2]:
        victim.wait_ready()
    restart = r.cluster.start_broker_later(leader)
    ledger = r.ledger(ids)
    recover_s = meter.stop()
    assert restart.wait(timeout=300) == 0, restart.stdout.read()
    check(
        "cluster: two workers killed while a broker is down",
        r,
        ledger,
        f"broker {leader} killed; 2 of 3 workers killed and restarted while it was down",
        recover_s,
        crashes=3,
    )
    assert all(w.process.poll() is None for w in workers)
