"""dlqapp.deadletters.entries: what the API and lists show of a DLQ entry (the presented
payload and the summary row)."""

from __future__ import annotations

import json

import pytest

from tests.unit.deadletters.entry_helpers import FULL_HEADERS, T0, build_entry, presented, summary

# -- what the API shows ------------------------------------------------------------------


def test_presented_parses_json_payloads_and_leaves_the_entry_alone():
    entry = build_entry("r-1", b'{"prompt": "x", "n": [1, 2]}', dict(FULL_HEADERS), 0, 0)
    shown = presented(entry)
    assert shown["payload"] == {"prompt": "x", "n": [1, 2]}
    assert "payload" not in entry
    assert {k: v for k, v in shown.items() if k != "payload"} == entry


@pytest.mark.parametrize(
    "payload, shown",
    [
        (b"{not json", "{not json"),
        (b"plain words", "plain words"),
        (b"42", 42),
        (b"null", None),
        (b"\xff\xfe", None),  # not text: the API shows its base64 instead
    ],
)
def test_presented_shows_text_that_is_not_json_as_text(payload, shown):
    assert presented(build_entry("r-1", payload, {}, 0, 0))["payload"] == shown


def test_presented_survives_a_payload_too_deep_to_parse():
    text = "[" * 100_000 + "]" * 100_000
    assert presented({"payload_text": text})["payload"] == text


def test_summary_lists_the_fields_of_a_list_row_and_a_short_preview():
    text = json.dumps({"request_id": "r-1", "model": "m", "prompt": "p" * 500})
    entry = build_entry("r-1", text.encode(), dict(FULL_HEADERS), 3, 4)
    row = summary(entry)
    assert row == {
        "request_id": "r-1",
        "key": "r-1",
        "error_class": "auth_error",
        "final_error": "401 Unauthorized",
        "last_error": "401",
        "model": "m",
        "attempts": 2,
        "retry_count": 1,
        "replay_count": 3,
        "first_seen": T0 - 500,
        "dead_at": T0 + 1001,
        "cost_usd": 0.0,
        "tenant": None,
        "payload_preview": text[:160],
    }


def test_a_summary_preview_counts_characters_and_names_binary_payloads():
    assert summary(build_entry("r-1", "é".encode() * 300, {}, 0, 0))["payload_preview"] == "é" * 160
    assert summary(build_entry("r-1", b"short", {}, 0, 0))["payload_preview"] == "short"
    assert summary(build_entry("r-1", b"\xff" * 77, {}, 0, 0))["payload_preview"] == "<77 bytes, not UTF-8>"


def test_a_summary_is_small_whatever_the_payload():
    entry = build_entry("r-1", b"q" * 1_000_000, dict(FULL_HEADERS), 0, 0)
    assert len(json.dumps(summary(entry))) < 1000
