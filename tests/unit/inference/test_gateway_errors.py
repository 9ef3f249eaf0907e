"""Every real error response in tests/fixtures/gateway_errors.json classifies as recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dlqapp.core.errors import ErrorClass
from dlqapp.inference.openai_errors import (
    classify_response,
    duration_ms,
    message_retry_ms,
    retry_after_ms,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gateway_errors.json"
CASES: list[dict[str, Any]] = json.loads(FIXTURES.read_text())["cases"]
SERVERS = {"openai", "azure-openai", "litellm", "vllm", "ollama", "tgi"}
NOW = 1_800_000_000.0


def test_the_fixtures_cover_every_server_and_class():
    assert {c["server"] for c in CASES} >= SERVERS
    wanted = {
        "context_length",
        "content_filter",
        "rate_limited",
        "quota_exceeded",
        "auth_error",
        "server_error",
        "invalid_request",
    }
    assert wanted <= {c["expected_class"] for c in CASES}
    assert len({c["id"] for c in CASES}) == len(CASES)
    for case in CASES:
        assert case["origin"] and ErrorClass(case["expected_class"])


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_fixture_classifies_as_recorded(case):
    failure = classify_response(case["status"], case["headers"], body=case["body"], now=case.get("now", NOW))
    assert failure.error_class.value == case["expected_class"], failure.message
    if "expected_retry_after_ms" in case:
        assert failure.retry_after_ms == case["expected_retry_after_ms"]
    elif failure.error_class.value in ("rate_limited", "server_error"):
        assert failure.retry_after_ms is None  # nothing in the response asked for a delay
    assert f"HTTP {case['status']}" in failure.message


@pytest.mark.parametrize(
    "value, ms",
    [
        ("1s", 1000),
        ("6m0s", 360_000),
        ("20ms", 20),
        ("4m12.172s", 252_172),
        ("1h2m3s", 3_723_000),
        ("", None),
        ("soon", None),
        ("12", None),
    ],
)
def test_go_durations(value, ms):
    assert duration_ms(value) == ms


@pytest.mark.parametrize(
    "message, ms",
    [
        ("Please try again in 18.642s. Visit", 18_642),
        ("please try again in 6ms.", 6),
        ("Please retry after 7 seconds.", 7000),
        ("retry after 250 milliseconds", 250),
        ("please try again in 1m30s", 90_000),
        ("please retry shortly", None),
    ],
)
def test_delays_stated_in_messages(message, ms):
    assert message_retry_ms(message.lower()) == ms


def test_plain_headers_win_over_forwarded_ones():
    assert retry_after_ms({"retry-after": "2", "llm_provider-retry-after": "60"}) == 2000
    assert retry_after_ms({"llm_provider-retry-after-ms": "1500"}) == 1500


def test_reset_headers_are_used_only_without_retry_after_or_a_stated_delay():
    headers = {"x-ratelimit-reset-requests": "1s", "x-ratelimit-remaining-requests": "0"}
    assert retry_after_ms(headers) == 1000
    assert retry_after_ms(headers, message="try again in 3s") == 3000
    assert retry_after_ms({**headers, "retry-after": "5"}, message="try again in 3s") == 5000


def test_iso_timestamp_reset():
    assert retry_after_ms({"x-ratelimit-reset-tokens": "2027-01-15T08:00:30Z"}, now=1_800_000_000.0) is not None
    assert retry_after_ms({"x-ratelimit-reset-tokens": "2027-01-15T08:00:30"}) is None  # no zone: not trusted


def test_a_context_word_in_a_rate_limit_is_still_a_rate_limit():
    body = {"error": {"message": "too many tokens per minute, context window fallbacks=None", "code": "429"}}
    assert classify_response(429, {}, body=body).error_class is ErrorClass.RATE_LIMITED


def test_quota_words_only_count_in_codes_and_types():
    body = {"error": {"message": "Quota exceeded for requests per minute", "type": "rate_limit_error"}}
    assert classify_response(429, {}, body=body).error_class is ErrorClass.RATE_LIMITED
