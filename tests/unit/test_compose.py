"""docker-compose.yml cannot run here (no Docker engine), so check its shape."""

from pathlib import Path

import yaml

from dlqapp.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[2]


def test_compose_runs_kafka_in_kraft_mode_and_a_worker_with_dlq_settings():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    kafka, worker = services["kafka"], services["worker"]
    assert kafka["image"].startswith("apache/kafka:4.")
    assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert worker["build"] == "." and (ROOT / "Dockerfile").exists()
    known = {env for env, _, _ in SETTINGS}
    assert set(worker["environment"]) <= known
    assert worker["environment"]["DLQ_KAFKA_BOOTSTRAP"] == "kafka:9092"
    assert worker["depends_on"]["kafka"]["condition"] == "service_healthy"
    mock = services["mock-llm"]
    assert mock["command"][0] == "dlqapp-mock-llm" and "8000:8000" in mock["ports"]
    assert worker["environment"]["DLQ_INFERENCE_URL"] == "http://mock-llm:8000/v1"


def test_compose_ships_no_usable_default_token():
    worker = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["worker"]
    token = worker["environment"]["DLQ_ADMIN_TOKEN"]
    assert token.startswith("${DLQ_ADMIN_TOKEN:?"), token  # compose refuses to start without one


def test_the_cluster_profile_runs_three_kraft_nodes_and_a_worker_replicating_on_them():
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    nodes = {name: s for name, s in services.items() if name in ("kafka-1", "kafka-2", "kafka-3")}
    assert sorted(nodes) == ["kafka-1", "kafka-2", "kafka-3"]
    voters = {n["environment"]["KAFKA_CONTROLLER_QUORUM_VOTERS"] for n in nodes.values()}
    assert voters == {"1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"}
    for name, node in nodes.items():
        env = node["environment"]
        assert node["profiles"] == ["cluster"] and node["image"].startswith("apache/kafka:4.")
        assert env["KAFKA_NODE_ID"] == int(name[-1]) and env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{name}:9092"
        assert (
            env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == 3
            and env["KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE"] == "false"
        )
        assert env["CLUSTER_ID"] == nodes["kafka-1"]["environment"]["CLUSTER_ID"] and "healthcheck" in node
    worker = services["worker-cluster"]
    env = worker["environment"]
    assert worker["profiles"] == ["cluster"] and set(env) <= {e for e, _, _ in SETTINGS}
    assert env["DLQ_KAFKA_BOOTSTRAP"] == "kafka-1:9092,kafka-2:9092,kafka-3:9092"
    assert (env["DLQ_REPLICATION_FACTOR"], env["DLQ_MIN_INSYNC_REPLICAS"]) == ("3", "2")
    assert all(worker["depends_on"][n]["condition"] == "service_healthy" for n in nodes)
    assert env["DLQ_ADMIN_TOKEN"].startswith("${DLQ_ADMIN_TOKEN:?")
    single = [name for name, s in services.items() if "profiles" not in s]
    assert "kafka" in single and not any(n in single for n in nodes)  # `docker compose up` stays single-node


def test_the_secured_profile_offers_only_sasl_ssl_with_acls_and_a_worker_holding_exactly_the_printed_ones():
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    kafka, worker = services["kafka-secured"], services["worker-secured"]
    env = kafka["environment"]
    assert (
        env["KAFKA_LISTENERS"] == "SASL_SSL://:9094,CONTROLLER://:9093"
        and "PLAINTEXT://" not in env["KAFKA_ADVERTISED_LISTENERS"]
    )
    assert (
        env["KAFKA_AUTHORIZER_CLASS_NAME"].endswith("StandardAuthorizer")
        and env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    )
    assert "faust -A dlqapp acls --principal User:dlqapp" in services["secured-acls"]["entrypoint"][-1]
    assert "kafka-acls.sh" in (ROOT / "deploy" / "secured" / "setup.sh").read_text()
    wenv = worker["environment"]
    assert set(wenv) <= {e for e, _, _ in SETTINGS}
    assert (wenv["DLQ_KAFKA_SECURITY_PROTOCOL"], wenv["DLQ_KAFKA_SASL_MECHANISM"], wenv["DLQ_KAFKA_SASL_USERNAME"]) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
        "dlqapp",
    )
    for secret in (wenv["DLQ_KAFKA_SASL_PASSWORD"], wenv["DLQ_ADMIN_TOKEN"], env["KAFKA_SSL_KEYSTORE_PASSWORD"]):
        assert secret.startswith("${"), secret  # no password ships in the file
    assert worker["depends_on"]["secured-setup"]["condition"] == "service_completed_successfully"
    assert all(s.get("profiles") == ["secured"] for n, s in services.items() if "secured" in n)
