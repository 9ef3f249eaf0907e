import re
from pathlib import Path

import pytest

from dlqapp.core.errors import ErrorClass
from dlqapp.settings import (
    SETTINGS,
    Settings,
    SettingsError,
    format_duration,
    markdown_table,
    parse_duration_ms,
)

ROOT = Path(__file__).resolve().parents[3]


def test_defaults_follow_the_contract():
    s = Settings.from_env({})
    assert s.retry_delays_ms == (1000, 10_000, 60_000)
    assert s.retry_topics == ("retry-1s", "retry-10s", "retry-1m")
    assert (s.input, s.dlq, s.results) == ("input", "dlq", "results")
    assert s.partitions == 12
    assert s.web_port == 6066
    assert s.simulated_success_rate == 0.8


def test_prefix_applies_to_every_topic():
    s = Settings.from_env({"DLQ_TOPIC_PREFIX": "team-a.", "DLQ_RETRY_DELAYS": "250ms,2s"})
    assert s.all_topics() == [
        "team-a.input",
        "team-a.retry-250ms",
        "team-a.retry-2s",
        "team-a.dlq",
        "team-a.results",
        "team-a.dlqapp-due",
        "team-a.dlqapp-commands",
    ]


@pytest.mark.parametrize(
    "env, var",
    [
        ({"DLQ_PARTITIONS": "zero"}, "DLQ_PARTITIONS"),
        ({"DLQ_PARTITIONS": "0"}, "DLQ_PARTITIONS"),
        ({"DLQ_WEB_PORT": "70000"}, "DLQ_WEB_PORT"),
        ({"DLQ_RETRY_DELAYS": "1s,soon"}, "DLQ_RETRY_DELAYS"),
        ({"DLQ_RETRY_DELAYS": ""}, "DLQ_RETRY_DELAYS"),
        ({"DLQ_SIMULATED_SUCCESS_RATE": "1.5"}, "DLQ_SIMULATED_SUCCESS_RATE"),
        ({"DLQ_RETRYABLE": "nonsense=true"}, "DLQ_RETRYABLE"),
        ({"DLQ_BACKOFF": "linear"}, "DLQ_BACKOFF"),
        ({"DLQ_TOPIC_PREFIX": "bad prefix/"}, "DLQ_TOPIC_PREFIX"),
        ({"DLQ_INPUT_TOPIC": "dlq"}, "DLQ_*_TOPIC"),
        ({"DLQ_RATE_LIMITS": "gpt-4o=fast"}, "DLQ_RATE_LIMITS"),
        ({"DLQ_CONCURRENCY_FLOOR": "0"}, "DLQ_CONCURRENCY_FLOOR"),
        ({"DLQ_CONCURRENCY": "8", "DLQ_CONCURRENCY_FLOOR": "9"}, "DLQ_CONCURRENCY_FLOOR"),
        ({"DLQ_ADAPTIVE_CONCURRENCY": "maybe"}, "DLQ_ADAPTIVE_CONCURRENCY"),
        ({"OTEL_TRACES_EXPORTER": "otlp,jaeger-thrift"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "udp"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
    ],
)
def test_a_bad_value_is_refused_naming_its_variable(env, var):
    with pytest.raises(SettingsError, match=re.escape(var)):
        Settings.from_env(env)


def test_retryable_overrides_apply_on_top_of_defaults():
    s = Settings.from_env({"DLQ_RETRYABLE": "context_length=true,unknown=false"})
    assert s.retryable[ErrorClass.CONTEXT_LENGTH] is True
    assert s.retryable[ErrorClass.UNKNOWN] is False
    assert s.retryable[ErrorClass.TIMEOUT] is True


@pytest.mark.parametrize(
    "text, ms", [("250ms", 250), ("1s", 1000), ("1.5", 1500), ("1m", 60_000), ("2h", 7_200_000), ("1d", 86_400_000)]
)
def test_durations(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("ms, text", [(1000, "1s"), (10_000, "10s"), (60_000, "1m"), (250, "250ms"), (90_000, "90s")])
def test_duration_names(ms, text):
    assert format_duration(ms) == text


def test_every_setting_has_a_default_that_validates_and_a_doc():
    assert Settings.from_env({})
    for env, _default, doc in SETTINGS:
        assert env.startswith(("DLQ_", "OTEL_")) and doc  # OTEL_: OpenTelemetry's own names


def test_the_settings_page_table_is_the_generated_one():
    page = (ROOT / "docs" / "settings.md").read_text()
    missing = [env for env, _, _ in SETTINGS if f"`{env}`" not in page]
    assert not missing, f"docs/settings.md lacks settings: {missing}"
    assert markdown_table() in page, "docs/settings.md's table is stale: run scripts/readme-settings"


def test_every_setting_the_readme_names_exists():
    named = set(re.findall(r"`(DLQ_[A-Z0-9_]+)", (ROOT / "README.md").read_text()))
    assert named and named <= {env for env, _, _ in SETTINGS}, named - {env for env, _, _ in SETTINGS}
