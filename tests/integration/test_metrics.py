"""/metrics after a run of known shape, JSON logs, and the Grafana dashboard's queries."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.kafka_io import (
    keys_seen,
    produce,
    read_topic,
    request_bytes,
)
from tests.support import http_json, unique, wait_until

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboard.json"


def scrape(worker, query: str = "") -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(worker.url + "/metrics" + query, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_a_known_run_and_json_logs_carry_the_fields(make_worker):
    worker = make_worker(
        env_extra={
            "DLQ_RETRY_DELAYS": "200ms,400ms,600ms",
            "DLQ_SIMULATED_SUCCESS_RATE": "1.0",
            "DLQ_LOG_FORMAT": "json",
        }
    ).start()
    plain = [unique("m-ok") for _ in range(15)]
    retried = unique("m-retry")
    dead = [unique("m-dead") for _ in range(4)]
    fail = lambda error: {"metadata": {"simulate": {"fail_times": 1, "error": error}}}  # noqa: E731
    messages = [(rid.encode(), request_bytes(rid)) for rid in plain]
    messages.append((retried.encode(), request_bytes(retried, **fail("server_error"))))
    messages += [(rid.encode(), request_bytes(rid, **fail("auth_error"))) for rid in dead]
    produce(worker.bootstrap, worker.topic("input"), messages)
    everything = set(plain + dead + [retried])
    read_topic(
        worker.bootstrap, [worker.topic("results"), worker.topic("dlq")], lambda r: everything <= keys_seen(r), 60
    )
    produce(
        worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid)) for rid in plain[:3]]
    )  # 3 duplicates
    wait_until(
        lambda: all(worker.get(f"/requests/{rid}/")[1].get("duplicates") == 1 for rid in plain[:3]), 30, "3 duplicates"
    )
    for rid in dead[:2]:  # 2 replays, which then succeed
        wait_until(
            lambda rid=rid: worker.get(f"/dlq/{rid}/")[0] == 200, 30, f"{rid} in the DLQ"
        )  # the dlq agent records it once read back
        assert http_json(worker.url + f"/dlq/{rid}/reprocess/", "POST")[0] == 200
    wait_until(
        lambda: all(worker.get(f"/requests/{rid}/")[1]["state"] == "succeeded" for rid in dead[:2]),
        30,
        "2 replays to succeed",
    )

    m = wait_until(
        lambda: (s := scrape(worker)) and value(s, "dlqapp_requests_total", outcome="succeeded") == 18 and s,
        15,
        "18 successes in /metrics",
    )
    assert value(m, "dlqapp_requests_total", outcome="dead_lettered") == 4
    assert value(m, "dlqapp_requests_total", outcome="duplicate_skipped") == 3
    assert value(m, "dlqapp_dead_letters_total", error_class="auth_error") == 4
    assert value(m, "dlqapp_duplicates_skipped_total") == 3
    assert value(m, "dlqapp_replays_total") == 2
    assert value(m, "dlqapp_attempts_total", tier="input") == 22  # 20 first attempts + 2 replays
    assert value(m, "dlqapp_attempts_total", tier="retry-200ms") == 1
    assert value(m, "dlqapp_dlq_entries") == 2
    assert value(m, "dlqapp_backend_call_duration_seconds_count", outcome="ok") == 18
    assert value(m, "dlqapp_backend_call_duration_seconds_count", outcome="auth_error") == 4
    assert value(m, "dlqapp_end_to_end_latency_seconds_count") == 18
    assert value(m, "dlqapp_retry_lateness_seconds_count", tier="retry-200ms") == 1
    assert value(m, "dlqapp_parked_retries", tier="retry-200ms") == 0
    assert value(m, "dlqapp_breaker_state", state="closed") == 1
    assert value(m, "dlqapp_event_loop_lag_seconds") >= 0
    assert any(name == "dlqapp_consumer_lag" and dict(labels)["topic"] == worker.topic("input") for name, labels in m)
    assert any(name.startswith("faust_") for name, _ in m)
    only = scrape(worker, "?name[]=dlqapp_event_loop_lag_seconds&name[]=dlqapp_requests_total")
    assert {name for name, _ in only} == {"dlqapp_event_loop_lag_seconds", "dlqapp_requests_total"}
    assert value(only, "dlqapp_requests_total", outcome="succeeded") == 18
    assert any(name.startswith("faust_") for name, _ in scrape(worker, "?name[]="))  # a blank name: everything

    lines = [json.loads(line) for line in worker.log_path.read_text().splitlines() if line.startswith("{")]
    alerts = [line for line in lines if line.get("event") == "dead_letter"]
    assert len(alerts) == 4 and all({"request_id", "topic", "attempt", "error_class"} <= set(a) for a in alerts)
    assert {a["request_id"] for a in alerts} == set(dead)


def test_every_dashboard_query_names_an_exposed_metric(make_worker):
    worker = make_worker().start()
    with urllib.request.urlopen(worker.url + "/metrics", timeout=10) as response:
        exposed = {f.name for f in text_string_to_metric_families(response.read().decode())}
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(dashboard["panels"]) >= 10 and queries
    for query in queries:
        for name in re.findall(r"\b(?:dlqapp|faust)_[a-z_]+", query):
            base = re.sub(r"_(bucket|count|sum|total)$", "", name)
            assert base in exposed or name in exposed, f"{query!r} uses {name}, which /metrics does not expose"
