"""deploy/prometheus: the alert rules pass `promtool test rules` (series that must fire and
series that must not), use only metrics dlqapp exports, and each has its runbook entry;
prometheus.yml is valid and scrapes every worker docker-compose.yml runs."""

from __future__ import annotations

import re

import yaml
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from dlqapp.observability import metrics
from tests.deploy.tools import ROOT, run, tool

PROMETHEUS = ROOT / "deploy" / "prometheus"


def rules() -> list[dict]:
    groups = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_the_alert_rules_fire_on_the_series_they_should_and_only_those():
    promtool = tool("promtool")
    run(promtool, "check", "rules", "alerts.yml", cwd=PROMETHEUS)
    result = run(promtool, "test", "rules", "alerts.test.yml", cwd=PROMETHEUS)
    assert "SUCCESS" in result.stdout + result.stderr
    tested = set(re.findall(r"alertname: (\w+)", (PROMETHEUS / "alerts.test.yml").read_text()))
    assert tested == {rule["alert"] for rule in rules()}  # every alert has its cases


def test_prometheus_yml_is_valid_and_loads_the_rules():
    result = run(tool("promtool"), "check", "config", "prometheus.yml", cwd=PROMETHEUS)
    assert f"{len(rules())} rules found" in result.stdout + result.stderr


def exported_series() -> set[str]:
    """Every series name a worker's /metrics can show for dlqapp's own metrics."""
    families = list(metrics.REGISTRY.collect())
    collector = metrics.StateCollector(
        dlq_entries=lambda: 0,
        parked_by_tier=lambda: {},
        consumer_lag=lambda: [],
        breaker_state=lambda: "closed",
        breaker_moves=lambda: {},
    )
    families += list(collector.collect())
    names = set()
    for family in families:
        if not family.name.startswith("dlqapp_"):
            continue
        if isinstance(family, HistogramMetricFamily) or family.type == "histogram":
            names |= {f"{family.name}_bucket", f"{family.name}_sum", f"{family.name}_count"}
        elif isinstance(family, CounterMetricFamily) or family.type == "counter":
            names.add(f"{family.name}_total")
        else:
            assert isinstance(family, GaugeMetricFamily) or family.type == "gauge", family
            names.add(family.name)
    return names


def test_the_rules_use_only_metrics_dlqapp_exports():
    exported = exported_series()
    assert {"dlqapp_worker_ready", "dlqapp_retry_lateness_seconds_bucket", "dlqapp_requests_total"} <= exported
    for rule in rules():
        used = set(re.findall(r"\bdlqapp_\w+", rule["expr"]))
        assert used and used <= exported, (
            f"{rule['alert']} uses {sorted(used - exported)}, which dlqapp does not export"
        )


def test_every_alert_has_a_runbook_entry_in_the_docs():
    production = (ROOT / "docs" / "production.md").read_text()
    headings = {line.lstrip("#").strip().lower() for line in production.splitlines() if line.startswith("### ")}
    for rule in rules():
        runbook = rule["annotations"]["runbook"]
        assert runbook == f"docs/production.md#{rule['alert'].lower()}", runbook
        assert rule["alert"].lower() in headings, f"no '### {rule['alert']}' in docs/production.md"
        assert rule["labels"]["severity"] in ("warning", "critical")


def test_prometheus_scrapes_every_worker_docker_compose_runs():
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    names = {name for sd in job["dns_sd_configs"] for name in sd["names"]}
    assert all(sd["port"] == 6066 for sd in job["dns_sd_configs"])
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    workers = {
        name
        for name, service in services.items()
        if service.get("build") == "." and "entrypoint" not in service and "command" not in service
    }
    assert workers and names == workers
    assert config["rule_files"] == ["alerts.yml"]
