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
