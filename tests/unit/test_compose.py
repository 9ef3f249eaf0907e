"""docker-compose.yml cannot run here (no Docker engine), so check its shape: a plain
`docker compose up` needs nothing exported, Kafka and the worker answer where the README's
demo looks for them, the worker honours simulate plans, and the profiles stay apart."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dlqapp.settings import SETTINGS, Settings

ROOT = Path(__file__).resolve().parents[2]
KNOWN = {env for env, _, _ in SETTINGS}
VARIABLE = re.compile(r"\$\{(\w+)(?::?([-?])([^}]*))?\}")


def services() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error}, the last refused like compose does."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.groups()
        if env.get(name):
            return env[name]
        if op == "?":
            raise AssertionError(f"${{{name}:?...}} stops `docker compose up` when {name} is not exported")
        return arg or ""

    return VARIABLE.sub(one, value)


def values(node):
    """Every scalar of a YAML tree."""
    if isinstance(node, dict):
        for item in node.values():
            yield from values(item)
    elif isinstance(node, list):
        for item in node:
            yield from values(item)
    elif isinstance(node, str):
        yield node


def test_a_plain_compose_up_needs_nothing_exported():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for value in values(compose):  # compose interpolates every service, whatever the profile
        interpolate(value, {})
    default = [s for s, svc in services().items() if "profiles" not in svc]
    assert sorted(default) == ["kafka", "worker"]  # Kafka and one worker: nothing else to start


def test_every_published_port_is_on_loopback_only_and_the_demo_token_is_usable():
    for name, service in services().items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond this machine"
    workers = [s for s in services().values() if s.get("environment", {}).get("DLQ_ADMIN_TOKEN")]
    assert len(workers) == 4
    for worker in workers:
        token = interpolate(worker["environment"]["DLQ_ADMIN_TOKEN"], {})
        assert Settings.from_env({"DLQ_ADMIN_TOKEN": token}).admin_token == token  # 16+ characters: accepted
        assert interpolate(worker["environment"]["DLQ_ADMIN_TOKEN"], {"DLQ_ADMIN_TOKEN": "mine-0123456789abc"}) == (
            "mine-0123456789abc"
        )
    readme = (ROOT / "README.md").read_text()
    assert token in readme  # the demo token is documented where the demo is


def listeners(spec: str) -> dict[str, str]:
    """`NAME://host:port,...` as {name: "host:port"}."""
    return dict(item.split("://", 1) for item in spec.split(","))


def test_kafka_answers_the_host_on_127_0_0_1_9092_and_the_containers_on_kafka_9092():
    kafka, worker = services()["kafka"], services()["worker"]
    env = kafka["environment"]
    assert kafka["image"].startswith("apache/kafka:4.") and env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    advertised, bound = listeners(env["KAFKA_ADVERTISED_LISTENERS"]), listeners(env["KAFKA_LISTENERS"])
    protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(bound) <= set(protocols) and set(advertised) <= set(bound)
    (host_listener,) = [name for name, address in advertised.items() if address == "127.0.0.1:9092"]
    container_port = bound[host_listener].rsplit(":", 1)[1]
    assert f"127.0.0.1:9092:{container_port}" in kafka["ports"]
    (inner,) = [name for name, address in advertised.items() if address == "kafka:9092"]
    assert bound[inner].endswith(":9092") and env["KAFKA_INTER_BROKER_LISTENER_NAME"] == inner
    assert worker["environment"]["DLQ_KAFKA_BOOTSTRAP"] == "kafka:9092"
    assert worker["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_the_readme_demo_reaches_what_compose_publishes_and_its_plans_are_honoured():
    worker = services()["worker"]
    env = worker["environment"]
    assert set(env) <= KNOWN and worker["build"] == "." and (ROOT / "Dockerfile").exists()
    # the CLI's defaults are where compose publishes Kafka and the worker
    defaults = Settings.from_env({})
    assert defaults.kafka_bootstrap == "127.0.0.1:9092" and defaults.web_url == "http://127.0.0.1:6066"
    assert "127.0.0.1:6066:6066" in worker["ports"] and env["DLQ_WEB_PORT"] == "6066"
    try_it = (ROOT / "README.md").read_text().split("## Try it", 1)[1].split("\n## ", 1)[0]
    assert 'bootstrap_servers="127.0.0.1:9092"' in try_it and "http://127.0.0.1:6066/" in try_it
    assert "--fail-share" in try_it and '"simulate"' in try_it
    # metadata.simulate (--fail-share, demo-1) is followed by the simulated backend only
    assert env["DLQ_INFERENCE"] == "simulated" and "DLQ_INFERENCE_URL" not in env
    assert "mock-llm" not in worker["depends_on"]
    assert "/readyz" in " ".join(worker["healthcheck"]["test"])


def test_the_mock_llm_is_an_opt_in_profile_with_a_worker_on_topics_of_its_own():
    mock, worker = services()["mock-llm"], services()["worker-llm"]
    assert "mock-llm" in mock["profiles"] and mock["command"][0] == "dlqapp-mock-llm"
    assert "127.0.0.1:8000:8000" in mock["ports"]
    env = worker["environment"]
    assert worker["profiles"] == ["mock-llm"] and set(env) <= KNOWN
    assert (env["DLQ_INFERENCE"], env["DLQ_INFERENCE_URL"]) == ("openai", "http://mock-llm:8000/v1")
    assert env["DLQ_TOPIC_PREFIX"] and env["DLQ_APP_ID"] != "dlqapp"  # never mixed with the demo worker's topics
    assert env["DLQ_KAFKA_BOOTSTRAP"] == "kafka:9092"
    ports = {p.rsplit(":", 1)[0] for s in services().values() for p in s.get("ports", [])}
    assert len(ports) == sum(len(s.get("ports", [])) for s in services().values())  # no host port twice
    for profile in ("cluster", "secured"):  # their workers call the mock too
        assert profile in mock["profiles"]


def test_the_cluster_profile_runs_three_kraft_nodes_and_a_worker_replicating_on_them():
    nodes = {name: s for name, s in services().items() if name in ("kafka-1", "kafka-2", "kafka-3")}
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
    worker = services()["worker-cluster"]
    env = worker["environment"]
    assert worker["profiles"] == ["cluster"] and set(env) <= KNOWN
    assert env["DLQ_KAFKA_BOOTSTRAP"] == "kafka-1:9092,kafka-2:9092,kafka-3:9092"
    assert (env["DLQ_REPLICATION_FACTOR"], env["DLQ_MIN_INSYNC_REPLICAS"]) == ("3", "2")
    assert all(worker["depends_on"][n]["condition"] == "service_healthy" for n in nodes)


def test_the_secured_profile_offers_only_sasl_ssl_with_acls_and_a_worker_holding_exactly_the_printed_ones():
    kafka, worker = services()["kafka-secured"], services()["worker-secured"]
    env = kafka["environment"]
    assert (
        env["KAFKA_LISTENERS"] == "SASL_SSL://:9094,CONTROLLER://:9093"
        and "PLAINTEXT://" not in env["KAFKA_ADVERTISED_LISTENERS"]
    )
    assert (
        env["KAFKA_AUTHORIZER_CLASS_NAME"].endswith("StandardAuthorizer")
        and env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    )
    assert "faust -A dlqapp acls --principal User:dlqapp" in services()["secured-acls"]["entrypoint"][-1]
    assert "kafka-acls.sh" in (ROOT / "deploy" / "secured" / "setup.sh").read_text()
    wenv = worker["environment"]
    assert set(wenv) <= KNOWN
    assert (wenv["DLQ_KAFKA_SECURITY_PROTOCOL"], wenv["DLQ_KAFKA_SASL_MECHANISM"], wenv["DLQ_KAFKA_SASL_USERNAME"]) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
        "dlqapp",
    )
    secrets = {
        "DLQ_KAFKA_SASL_PASSWORD": wenv["DLQ_KAFKA_SASL_PASSWORD"],
        "KAFKA_KEYSTORE_PASSWORD": env["KAFKA_SSL_KEYSTORE_PASSWORD"],
        "KAFKA_ADMIN_PASSWORD": services()["secured-certs"]["environment"]["KAFKA_ADMIN_PASSWORD"],
    }
    for name, value in secrets.items():
        assert interpolate(value, {}) == "", f"{name} has a default: a password ships in the file"
        assert interpolate(value, {name: "s3cret"}) == "s3cret"
    # the set-up steps stop, naming the secret, when one was not exported
    scripts = (ROOT / "deploy" / "secured" / "certs.sh").read_text() + (ROOT / "deploy/secured/setup.sh").read_text()
    for name in secrets:
        assert f'"${{{name}:?export {name}' in scripts
    assert worker["depends_on"]["secured-setup"]["condition"] == "service_completed_successfully"
    assert all(s.get("profiles") == ["secured"] for n, s in services().items() if "secured" in n)


def test_docker_compose_accepts_the_file_with_nothing_exported():
    """`docker-compose config` (Debian's docker-compose; scripts/deploy-tools installs it)
    validates the file and interpolates every variable without a Docker engine."""
    tool = shutil.which("docker-compose")
    if tool is None:
        if os.environ.get("CI") == "true":
            pytest.fail("docker-compose not found: run scripts/deploy-tools (CI runs it from .ci/run)")
        pytest.skip("docker-compose not found: run scripts/deploy-tools")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLQ_", "KAFKA_"))}
    profiles = ["--profile", "mock-llm", "--profile", "cluster", "--profile", "secured", "--profile", "monitoring"]
    for extra in ([], profiles):
        result = subprocess.run(
            [tool, "-f", "docker-compose.yml", *extra, "config", "-q"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
