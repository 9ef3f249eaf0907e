"""dlqapp on a secured Kafka (issue 31): SASL_SSL with SCRAM and the KRaft authorizer, the
ACLs granted with Kafka's own AclCommand from exactly what `faust -A dlqapp acls` printed;
mutual TLS and SASL_PLAINTEXT with PLAIN once each; misconfiguration ends the worker at
start with an error naming what to fix; no secret in logs, HTTP answers or metrics."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import urllib.request
from functools import partial
from pathlib import Path

import pytest

from tests.chaos.ledger import FULL, Ledger
from tests.kafka_io import keys_seen, produce, read_topic, request_bytes, topics_named
from tests.secure import SecureKafka, secured_worker
from tests.support import FAUST, Worker, http_json, unique, unique_ids, wait_until

FAST = {"DLQ_RETRY_DELAYS": "200ms,400ms,600ms", "DLQ_SIMULATED_SUCCESS_RATE": "1.0"}


@pytest.fixture
def workers():
    """Every worker a test makes, killed at its end (they are not made by `make_worker`)."""
    made: list[Worker] = []
    yield made
    for worker in made:
        worker.kill()


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    kafka = SecureKafka(tmp_path_factory.mktemp("sasl-ssl-kafka"), "sasl_ssl", authorizer=True).start()
    yield kafka
    kafka.stop()


def failing(rid: str, times: int, error: str) -> bytes:
    return request_bytes(rid, metadata={"simulate": {"fail_times": times, "error": error}})


def cli(worker: Worker, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FAUST), "-A", "dlqapp", *args],
        env={**worker.env(), "DLQ_WEB_URL": worker.url},
        cwd=worker.tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )


def outcomes(kafka: SecureKafka, worker: Worker, ids: list[str]) -> dict[str, str]:
    """request id → the topic of its last outcome, read as the super user."""
    wanted = set(ids)
    records = read_topic(
        kafka.bootstrap,
        [worker.topic("results"), worker.topic("dlq")],
        lambda r: wanted <= keys_seen(r),
        60,
        client=kafka.admin_client(),
    )
    return {
        r.key.decode(): r.topic.rsplit(".", 1)[-1] for r in records if r.key and r.key.decode() in wanted and r.value
    }


def assert_no_secret(kafka: SecureKafka, *texts: str) -> None:
    for user in ("dlqapp", "admin"):
        secret = kafka.secret(user)
        assert all(secret not in text for text in texts), f"the {user} password leaked"


def test_the_whole_pipeline_runs_on_sasl_ssl_with_only_the_acls_it_printed(secure, tmp_path, workers):
    worker = secured_worker(secure, tmp_path, env_extra=FAST)
    workers.append(worker)
    granted = secure.apply_acls(worker)
    assert any("--group" in line for line in granted) and not any("--cluster" in line for line in granted)
    worker.start()
    ok, retried, dead = unique_ids("ok", 10), unique_ids("retried", 5), unique_ids("dead", 5)
    messages = [(r.encode(), request_bytes(r)) for r in ok] + [
        (r.encode(), failing(r, 1, "server_error")) for r in retried
    ]
    messages += [(r.encode(), failing(r, 1, "auth_error")) for r in dead]
    produce(secure.bootstrap, worker.topic("input"), messages, client=secure.admin_client())
    found = outcomes(secure, worker, ok + retried + dead)
    assert found == {**{r: "results" for r in ok + retried}, **{r: "dlq" for r in dead}}
    wait_until(lambda: worker.get("/dlq/")[1]["total"] == 5, 30, "five dead letters listed")

    for rid in dead[:2]:
        status, body = http_json(f"{worker.url}/dlq/{rid}/reprocess/", "POST")
        assert status == 200 and body["status"] == "reprocessed", body
    replayed = cli(worker, "dlq-reprocess", "--key", dead[2])
    assert replayed.returncode == 0, replayed.stderr
    wait_until(
        lambda: all(worker.get(f"/requests/{r}/")[1].get("state") == "succeeded" for r in dead[:3]),
        60,
        "the replays to succeed",
    )

    def counts_right() -> bool:
        stats = worker.get("/dlq/stats/")[1]
        return (
            stats["received"] == 20
            and stats["succeeded"] == 18
            and stats["dlq_size"] == 2
            and stats["reprocessed"] == 3
        )

    wait_until(counts_right, 30, lambda: f"the counts: {worker.get('/dlq/stats/')[1]}")
    reply_prefix = f"{worker.app_id}-reply-"
    assert len(topics_named(secure.bootstrap, reply_prefix, client=secure.admin_client())) == 1
    worker.stop()
    assert topics_named(secure.bootstrap, reply_prefix, client=secure.admin_client()) == set()  # deleted at the stop
    worker.start()  # the tables come back from their changelogs, on the secured broker
    wait_until(counts_right, 60, lambda: f"the counts after a restart: {worker.get('/dlq/stats/')[1]}")
    assert worker.get(f"/requests/{retried[0]}/")[1]["state"] == "succeeded"

    seen = [
        worker.log_path.read_text(errors="replace"),
        str(worker.get("/")[1]),
        str(worker.get("/dlq/stats/")[1]),
        str(worker.get("/health/")[1]),
        replayed.stdout,
        replayed.stderr,
    ]
    with urllib.request.urlopen(f"{worker.url}/metrics", timeout=30) as response:
        metrics = response.read().decode()
    assert "dlqapp_requests_total" in metrics
    assert "SASL_SSL SCRAM-SHA-512 as dlqapp" in seen[0]
    assert_no_secret(secure, *seen, metrics)


@pytest.mark.parametrize(
    ("case", "env", "named"),
    [
        (
            "plaintext",
            {
                "DLQ_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT",
                "DLQ_KAFKA_SASL_MECHANISM": "",
                "DLQ_KAFKA_SASL_USERNAME": "",
                "DLQ_KAFKA_SASL_PASSWORD_FILE": "",
                "DLQ_KAFKA_SSL_CAFILE": "",
            },
            "DLQ_KAFKA_SECURITY_PROTOCOL=PLAINTEXT",
        ),
        (
            "wrong password",
            {"DLQ_KAFKA_SASL_PASSWORD_FILE": "", "DLQ_KAFKA_SASL_PASSWORD": "not-the-password-42"},
            "check DLQ_KAFKA_SASL_PASSWORD",
        ),
        ("untrusted broker", {"DLQ_KAFKA_SSL_CAFILE": ""}, "set DLQ_KAFKA_SSL_CAFILE"),
        ("missing ACL", {}, "READ on group"),
    ],
)
def test_misconfiguration_ends_the_worker_at_start_naming_what_to_fix(secure, tmp_path, workers, case, env, named):
    worker = secured_worker(secure, tmp_path, env_extra=env)
    workers.append(worker)
    if case == "missing ACL":
        secure.apply_acls(worker, skip="--group")
    worker.start(wait=False)
    try:
        code = worker.process.wait(timeout=90)  # a hang would time out here
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{case}: the worker kept running:\n{worker.log_tail()}") from None
    log = worker.log_path.read_text(errors="replace")
    assert code == 3 and "refusing to start" in log and named in log, log[-3000:]
    if case == "missing ACL":
        assert "faust -A dlqapp acls --principal User:dlqapp" in log
    assert "not-the-password-42" not in log
    assert_no_secret(secure, log)


@pytest.mark.parametrize(("security", "mechanism"), [("ssl", None), ("sasl_plaintext", "PLAIN")])
def test_mutual_tls_and_sasl_plain_connect_too(tmp_path, workers, security, mechanism):
    kafka = SecureKafka(tmp_path / "kafka", security, authorizer=False).start()
    try:
        env = {**FAST, **({"DLQ_KAFKA_SASL_MECHANISM": mechanism} if mechanism else {})}
        worker = secured_worker(kafka, tmp_path, env_extra=env)
        workers.append(worker)
        if security == "ssl":
            assert worker.env()["DLQ_KAFKA_SSL_CERTFILE"].endswith("dlqapp.pem")  # a client certificate, no password
        worker.start()
        ids = unique_ids(security, 5)
        produce(
            kafka.bootstrap,
            worker.topic("input"),
            [(r.encode(), request_bytes(r)) for r in ids],
            client=kafka.admin_client(),
        )
        assert set(outcomes(kafka, worker, ids).values()) == {"results"}
        assert (
            f'kafka="{"SSL with a client certificate" if security == "ssl" else "SASL_PLAINTEXT PLAIN as dlqapp"}"'
        ) in worker.log_path.read_text()
        worker.kill()
    finally:
        kafka.stop()


def test_kill_9_on_the_secured_broker_loses_nothing(secure, tmp_path, workers):
    count, kills = (20_000, 5) if FULL else (3_000, 2)
    worker = secured_worker(
        secure,
        tmp_path,
        env_extra={
            "DLQ_RETRY_DELAYS": "200ms,400ms,600ms",
            "DLQ_SIMULATED_SUCCESS_RATE": "0.8",
            "DLQ_SESSION_TIMEOUT": "6s",
        },
    )
    workers.append(worker)
    secure.apply_acls(worker)
    worker.start()
    ids = unique_ids("kill", count)
    produce(
        secure.bootstrap,
        worker.topic("input"),
        [(r.encode(), request_bytes(r)) for r in ids],
        client=secure.admin_client(),
    )
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "31")))

    def received(target: int) -> bool:
        return worker.get("/dlq/stats/")[1]["received"] >= target if worker.process.poll() is None else False

    for kill in range(kills):
        target = int(count * (kill + 1) / (kills + 1) * rng.uniform(0.8, 1.0))
        wait_until(partial(received, target), 300, f"{target} received before kill {kill + 1}")
        worker.kill()
        worker.start()
    ledger = Ledger.read(
        secure.bootstrap, worker.topic("results"), worker.topic("dlq"), ids, timeout=600, client=secure.admin_client()
    )
    print({**ledger.summary(), "kills": kills, "broker": "SASL_SSL + ACLs"})
    assert ledger.lost == []


def test_exactly_once_runs_with_the_printed_acls_and_a_missing_transactional_id_grant_is_named(
    secure, tmp_path, workers
):
    env = {**FAST, "DLQ_PROCESSING_GUARANTEE": "exactly_once"}
    refused = secured_worker(secure, tmp_path, env_extra=env, name="no-txn-grant")
    workers.append(refused)
    secure.apply_acls(refused, skip="--transactional-id")
    refused.start(wait=False)
    assert refused.process.wait(timeout=120) != 0
    log = refused.log_path.read_text(errors="replace")
    assert f"transactional ids {refused.app_id}- (prefixed)" in log and "faust -A dlqapp acls" in log, log[-3000:]

    worker = secured_worker(secure, tmp_path, env_extra=env, name="eos")
    workers.append(worker)
    assert any("--transactional-id" in line for line in secure.apply_acls(worker))
    worker.start()
    ids = unique_ids("eos", 30)
    produce(
        secure.bootstrap,
        worker.topic("input"),
        [(r.encode(), request_bytes(r)) for r in ids],
        client=secure.admin_client(),
    )
    ledger = Ledger.read(
        secure.bootstrap,
        worker.topic("results"),
        worker.topic("dlq"),
        ids,
        timeout=120,
        client={**secure.admin_client(), "isolation_level": "read_committed"},
    )
    assert ledger.lost == [] and ledger.duplicate_outcomes == 0 and len(ledger.results) == 30


def test_kafka_local_writes_client_files_for_dlqapp_and_kafkas_tools(secure):
    env = secure.client_env()
    assert (
        env["DLQ_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
        and env["DLQ_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
        and env["DLQ_KAFKA_SASL_USERNAME"] == "dlqapp"
    )
    assert Path(env["DLQ_KAFKA_SASL_PASSWORD_FILE"]).read_text() == secure.secret("dlqapp")
    assert oct((secure.data_dir / "client.env").stat().st_mode)[-3:] == "600"
    listed = secure.kafka_tool("org.apache.kafka.tools.TopicCommand", "--list")
    assert listed.returncode == 0, listed.stderr  # admin.properties works with Kafka's own tools
    config = secure.kafka_tool(
        "kafka.admin.ConfigCommand", "--describe", "--entity-type", "users", "--entity-name", "dlqapp"
    )
    assert config.returncode == 0 and "SCRAM-SHA-512" in config.stdout, config.stdout + config.stderr


def test_without_delete_on_its_reply_topics_a_worker_runs_and_its_stop_names_the_grant(secure, tmp_path, workers):
    """Delete on `<app id>-reply-` is printed by `acls` but optional: without it the worker
    starts, and its stop leaves the reply topic with one WARNING line naming the grant."""
    worker = secured_worker(secure, tmp_path, env_extra=FAST)
    workers.append(worker)
    secure.apply_acls(worker, skip="--operation Delete")
    worker.start()
    rid = unique("nodelete")
    produce(secure.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid))], client=secure.admin_client())
    assert outcomes(secure, worker, [rid]) == {rid: "results"}
    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(timeout=60) == 0, worker.log_tail()
    log = worker.log_path.read_text(errors="replace")
    left = topics_named(secure.bootstrap, f"{worker.app_id}-reply-", client=secure.admin_client())
    assert len(left) == 1 and "reply_topic_left" in log, log[-3000:]
    assert f"allow Delete on topics prefixed {worker.app_id}-reply-" in log
