"""deploy/kubernetes rendered by kustomize (no cluster): every core resource valid against
Kubernetes' own schemas (kubernetes-validate, strict), KEDA's against a schema written from
its documentation, and the whole consistent with what a dlqapp worker needs: stable names for
DLQ_WEB_ADVERTISED_URL, probes on /livez and /readyz, a grace period covering the drain,
memory for the documented budget, settings a worker accepts, autoscaling capped at the
partition count."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from jsonschema import Draft202012Validator

from dlqapp.settings import SETTINGS, Settings
from dlqapp.settings.parsing import parse_duration_ms
from tests.deploy.tools import ROOT, run, tool

KUBERNETES = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.34.0"
KEDA_SCHEMA = json.loads((Path(__file__).parent / "keda.schema.json").read_text())
MiB = 1024 * 1024


def render(path: Path) -> list[dict]:
    """`kustomize build` of a kustomization folder, as resources."""
    output = run(tool("kustomize"), "build", str(path)).stdout
    return [doc for doc in yaml.safe_load_all(output) if doc]


@pytest.fixture(scope="module", params=["base", "overlays/autoscaling", "overlays/at-least-once"])
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, render(KUBERNETES / request.param)


def one(resources: list[dict], kind: str, name_prefix: str = "") -> dict:
    """The one resource of `kind` whose name starts with `name_prefix` (generated names end in a hash)."""
    (found,) = [r for r in resources if r["kind"] == kind and r["metadata"]["name"].startswith(name_prefix)]
    return found


def named(resources: list[dict], kind: str, name: str) -> dict:
    (found,) = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    return found


def worker_container(resources: list[dict]) -> dict:
    (container,) = one(resources, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    return container


def settings_of(resources: list[dict]) -> dict[str, str]:
    return one(resources, "ConfigMap", "dlqapp-settings")["data"]


def test_every_resource_is_valid_kubernetes_or_valid_keda(rendered):
    _, resources = rendered
    keda = Draft202012Validator(KEDA_SCHEMA)
    for resource in resources:
        if resource["apiVersion"].startswith("keda.sh/"):
            problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in keda.iter_errors(resource)]
            assert not problems, f"{resource['kind']}/{resource['metadata']['name']}: {problems}"
        else:
            kubernetes_validate.validate(resource, K8S_VERSION, strict=True)


def test_strict_validation_refuses_a_misspelt_field():
    """The checks above can fail: a field Kubernetes does not know is refused."""
    statefulset = one(render(KUBERNETES / "base"), "StatefulSet")
    statefulset["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 60
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(statefulset, K8S_VERSION, strict=True)
    scaled = one(render(KUBERNETES / "overlays/autoscaling"), "ScaledObject")
    scaled["spec"]["triggers"][0]["metadata"]["lagTreshold"] = "10"
    assert list(Draft202012Validator(KEDA_SCHEMA).iter_errors(scaled))


def env_of(container: dict) -> dict[str, dict]:
    return {item["name"]: item for item in container["env"]}


def test_each_worker_advertises_its_own_stable_name_through_the_headless_service(rendered):
    _, resources = rendered
    statefulset, container = one(resources, "StatefulSet"), worker_container(resources)
    headless = named(resources, "Service", "dlqapp-workers")
    assert statefulset["spec"]["serviceName"] == headless["metadata"]["name"]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
    for service in (r for r in resources if r["kind"] == "Service"):
        assert service["spec"]["selector"].items() <= pod_labels.items()
    assert statefulset["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    env = env_of(container)
    names = [item["name"] for item in container["env"]]
    port = int(settings_of(resources)["DLQ_WEB_PORT"])
    advertised = env["DLQ_WEB_ADVERTISED_URL"]["value"]
    assert advertised == f"http://$(POD_NAME).{headless['metadata']['name']}.$(POD_NAMESPACE).svc:{port}"
    # $(VAR) is expanded only from variables defined before it
    assert names.index("POD_NAME") < names.index("DLQ_WEB_ADVERTISED_URL")
    assert names.index("POD_NAMESPACE") < names.index("DLQ_WEB_ADVERTISED_URL")
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert {"name": "http", "containerPort": port} in container["ports"]
    assert settings_of(resources)["DLQ_WEB_HOST"] == "0.0.0.0"
    api = named(resources, "Service", "dlqapp")
    assert api["metadata"]["name"] == "dlqapp" and "clusterIP" not in api["spec"]
    assert env["DLQ_ALLOWED_HOSTS"]["value"].split(",")[0] == api["metadata"]["name"]


def test_probes_use_livez_and_readyz_and_the_grace_period_covers_the_drain(rendered):
    _, resources = rendered
    container = worker_container(resources)
    assert container["startupProbe"]["httpGet"]["path"] == "/livez"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == "http"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 90 + 30  # topic checks retry for 90 s
    settings = settings_of(resources)
    drain_s = parse_duration_ms(settings["DLQ_DRAIN_TIMEOUT"]) / 1000
    transaction_s = parse_duration_ms(settings["DLQ_TRANSACTION_TIMEOUT"]) / 1000
    grace = one(resources, "StatefulSet")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= drain_s + transaction_s + 15  # drain, the last commits, leaving the group
    pdb = one(resources, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert (
        pdb["spec"]["selector"]["matchLabels"].items()
        <= one(resources, "StatefulSet")["spec"]["template"]["metadata"]["labels"].items()
    )


def quantity_bytes(text: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", text).groups()
    return int(number) * {"Mi": MiB, "Gi": 1024 * MiB}[unit]


def test_memory_covers_the_measured_budget(rendered):
    _, resources = rendered
    settings = settings_of(resources)
    # docs/performance.md, Memory budget: about 95 MiB of Python, RocksDB's cache and write
    # buffers as set, the requests read ahead, and about 20 KiB per call in flight
    budget = (
        95 * MiB
        + int(settings["DLQ_TABLE_CACHE_BYTES"])
        + int(settings["DLQ_TABLE_MEMTABLE_BUDGET_BYTES"])
        + int(settings["DLQ_READ_AHEAD_BYTES"])
        + int(settings["DLQ_CONCURRENCY"]) * 20 * 1024
    )
    resources_ = worker_container(resources)["resources"]
    request, limit = quantity_bytes(resources_["requests"]["memory"]), quantity_bytes(resources_["limits"]["memory"])
    assert budget <= request <= limit and limit >= 2 * budget
    assert "cpu" not in resources_["limits"]  # a throttled event loop makes retries late


def test_the_worker_accepts_the_settings_and_finds_its_credentials_mounted(rendered, tmp_path):
    _, resources = rendered
    settings, container = settings_of(resources), worker_container(resources)
    known = {name for name, _, _ in SETTINGS}
    env = env_of(container)
    assert set(settings) <= known and {n for n in env if n.startswith("DLQ_")} <= known
    secret = one(resources, "Secret", "dlqapp-credentials")
    for item in env.values():
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["data"]
    # every file setting points into a volume that holds that file
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in one(resources, "StatefulSet")["spec"]["template"]["spec"]["volumes"]}
    for name in ("DLQ_KAFKA_SASL_PASSWORD_FILE", "DLQ_KAFKA_SSL_CAFILE"):
        folder, file = settings[name].rsplit("/", 1)
        source = volumes[mounts[folder]]["secret"]
        assert source["secretName"] == secret["metadata"]["name"]
        assert any(i["path"] == file and i["key"] in secret["data"] for i in source["items"])
    data_volume = mounts[settings["DLQ_DATA_DIR"]]
    claims = {c["metadata"]["name"] for c in one(resources, "StatefulSet")["spec"].get("volumeClaimTemplates", [])}
    assert data_volume in claims or "emptyDir" in volumes[data_volume]
    # the settings as the worker reads them (files replaced by local ones, the secrets by values)
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    parsed = Settings.from_env(
        {
            **settings,
            "DLQ_KAFKA_SASL_PASSWORD_FILE": str(password),
            "DLQ_KAFKA_SSL_CAFILE": "",
            "DLQ_KAFKA_SASL_USERNAME": "dlqapp",
            "DLQ_WEB_ADVERTISED_URL": "http://dlqapp-0.dlqapp-workers.prod.svc:6066",
            "DLQ_ALLOWED_HOSTS": "dlqapp,dlqapp.prod.svc",
        }
    )
    assert parsed.partitions >= 1 and parsed.kafka_security.protocol == "SASL_SSL"


def test_a_persistent_volume_only_where_the_tables_outlive_a_restart(rendered):
    name, resources = rendered
    settings, statefulset = settings_of(resources), one(resources, "StatefulSet")
    claims = statefulset["spec"].get("volumeClaimTemplates", [])
    if settings["DLQ_PROCESSING_GUARANTEE"] == "exactly_once":
        assert not claims, "exactly_once drops the local tables at start: a volume buys nothing"
    else:
        assert [c["metadata"]["name"] for c in claims] == ["data"], name
        names = [v["name"] for v in statefulset["spec"]["template"]["spec"]["volumes"]]
        assert "data" not in names


def test_autoscaling_follows_the_consumer_lag_of_the_workers_group_and_stops_at_the_partition_count():
    resources = render(KUBERNETES / "overlays" / "autoscaling")
    scaled, statefulset = one(resources, "ScaledObject"), one(resources, "StatefulSet")
    settings = settings_of(resources)
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "StatefulSet", "dlqapp")
    assert statefulset["metadata"]["name"] == target["name"]
    assert "replicas" not in statefulset["spec"]  # KEDA owns it: an apply must not reset it
    assert scaled["spec"]["maxReplicaCount"] == int(settings["DLQ_PARTITIONS"])
    assert scaled["spec"]["minReplicaCount"] >= 1  # parked retries and the API need a running worker
    (trigger,) = scaled["spec"]["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "kafka" and meta.get("allowIdleConsumers", "false") == "false"
    assert meta["bootstrapServers"] == settings["DLQ_KAFKA_BOOTSTRAP"]
    assert meta["consumerGroup"] == settings["DLQ_APP_ID"]
    assert meta["topic"] == settings.get("DLQ_TOPIC_PREFIX", "") + settings.get("DLQ_INPUT_TOPIC", "input")
    assert int(meta["lagThreshold"]) > 0
    # the trigger connects as the worker does
    mechanism = settings["DLQ_KAFKA_SASL_MECHANISM"].lower().replace("-", "_").replace("sha_", "sha")
    assert meta["sasl"] == mechanism and meta["tls"] == "enable"
    assert settings["DLQ_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    auth = one(resources, "TriggerAuthentication")
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    secret = one(resources, "Secret", "dlqapp-credentials")
    refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
    assert set(refs) == {"username", "password", "ca"}
    for ref in refs.values():
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["data"]
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert all(p["type"] == "Pods" and p["value"] == 1 for p in behavior["scaleDown"]["policies"])


def test_an_overlay_replacing_the_credentials_as_docs_kubernetes_md_shows_renders(tmp_path):
    """The walkthrough's overlay: real files replace the fail-closed placeholders."""
    for name, text in {"admin-token": "x" * 32, "kafka-password": "pw", "ca.pem": "PEM"}.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namespace": "prod",
                "resources": [os.path.relpath(KUBERNETES / "overlays" / "autoscaling", tmp_path)],
                "secretGenerator": [
                    {
                        "name": "dlqapp-credentials",
                        "behavior": "merge",
                        "files": ["admin-token", "kafka-password", "kafka-ca.pem=ca.pem"],
                    }
                ],
            }
        )
    )
    docs = (ROOT / "docs" / "kubernetes.md").read_text()
    assert "behavior: merge" in docs and "kafka-ca.pem=" in docs
    resources = render(tmp_path)
    secret = one(resources, "Secret", "dlqapp-credentials")
    assert secret["metadata"]["namespace"] == "prod" and secret["data"]["kafka-password"] == "cHc="  # base64 of pw
    auth = one(resources, "TriggerAuthentication")
    assert {r["name"] for r in auth["spec"]["secretTargetRef"]} == {secret["metadata"]["name"]}
    assert (
        worker_container(resources)["envFrom"][0]["configMapRef"]["name"]
        == one(resources, "ConfigMap", "dlqapp-settings")["metadata"]["name"]
    )
