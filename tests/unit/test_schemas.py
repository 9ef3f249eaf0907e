"""The JSON Schemas shipped in dlqapp/schemas/: valid draft 2020-12, true to the code that
reads and writes the messages, and true to the README's examples."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from dlqapp.core.envelope import Attempt, Result
from dlqapp.core.errors import ErrorClass
from dlqapp.core.requests import InvalidRequest, validate_request
from dlqapp.deadletters.entries import DeadLetterEntry
from tests.schemas import SCHEMAS, assert_valid, errors, key_form, schema

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", SCHEMAS)
def test_each_schema_is_a_draft_2020_12_schema_shipped_with_the_package(name):
    Draft202012Validator.check_schema(schema(name))
    assert schema(name)["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert (ROOT / "dlqapp" / "schemas" / f"{name}.schema.json").exists()
    assert "schemas/*.json" in (ROOT / "pyproject.toml").read_text()  # package-data: installed with dlqapp


def readme_json_blocks() -> list[dict]:
    section = (ROOT / "README.md").read_text().split("### A request and its result", 1)[1].split("\n### ", 1)[0]
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", section, re.S)]


def test_the_readme_request_and_result_validate():
    request, result = readme_json_blocks()
    assert_valid("input", request)
    assert_valid("result", result)
    validate_request(request)  # and dlqapp takes the request


GOOD = [
    {"request_id": "r1", "prompt": "hi"},
    {"request_id": "r1", "messages": [{"role": "user", "content": "hi"}]},
    {"request_id": "r1", "messages": [{"role": "tool", "content": None, "tool_call_id": "x"}], "prompt": None},
    {"request_id": "r1", "prompt": "hi", "model": None, "params": None, "metadata": None, "priority": None},
    {"request_id": "r1", "prompt": "hi", "deadline": 1, "priority": "low", "extra": {"any": "thing"}},
    {"request_id": "r" * 256, "prompt": "hi", "metadata": {"simulate": {"fail_times": 2}, "tenant": "acme"}},
    {"request_id": " x ", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
]
BAD = [
    {"prompt": "no id"},
    {"request_id": "", "prompt": "hi"},
    {"request_id": "   ", "prompt": "hi"},
    {"request_id": "r" * 257, "prompt": "hi"},
    {"request_id": 42, "prompt": "hi"},
    {"request_id": "r1"},
    {"request_id": "r1", "prompt": None, "messages": None},
    {"request_id": "r1", "prompt": ""},
    {"request_id": "r1", "prompt": ["a"]},
    {"request_id": "r1", "messages": []},
    {"request_id": "r1", "messages": ["hi"]},
    {"request_id": "r1", "messages": [{"role": "robot", "content": "hi"}]},
    {"request_id": "r1", "messages": [{"content": "hi"}]},
    {"request_id": "r1", "messages": [{"role": "user", "content": 5}]},
    {"request_id": "r1", "prompt": "hi", "model": 3},
    {"request_id": "r1", "prompt": "hi", "params": []},
    {"request_id": "r1", "prompt": "hi", "metadata": "x"},
    {"request_id": "r1", "prompt": "hi", "deadline": 0},
    {"request_id": "r1", "prompt": "hi", "deadline": True},
    {"request_id": "r1", "prompt": "hi", "deadline": 1.5},
    {"request_id": "r1", "prompt": "hi", "deadline": 253_402_300_800_000},
    {"request_id": "r1", "prompt": "hi", "priority": "urgent"},
]


@pytest.mark.parametrize(
    "doc", GOOD + BAD, ids=[f"good{i}" for i in range(len(GOOD))] + [f"bad{i}" for i in range(len(BAD))]
)
def test_the_input_schema_accepts_exactly_what_dlqapp_accepts(doc):
    try:
        validate_request(doc)
        accepted = True
    except InvalidRequest:
        accepted = False
    assert accepted == (doc in GOOD), "the case list is wrong"
    assert (errors("input", doc) == []) == accepted, errors("input", doc)


def attempt(n, error_class=None):
    return Attempt(n, 1_700_000_000_000 + n, "input" if n == 1 else "retry-1s", None if n == 1 else 1, 12, error_class)


def test_a_result_as_dlqapp_writes_it_validates_with_every_field_declared():
    history = [attempt(1, "timeout").as_dict(), attempt(2).as_dict()]
    result = Result("r1", "sim-small", "hello", 2, 840, 1_700_000_000_900, {"team": "a"}, {"prompt_tokens": 3}, history)
    assert_valid("result", json.loads(result.to_bytes()))
    assert_valid("result", json.loads(Result("r1", "m", "", 1, 0, 1, {}).to_bytes()))  # usage and history null
    with_totals = {
        **json.loads(result.to_bytes()),
        "tokens": {"prompt": 3, "completion": 5, "cached": 0},
        "cost_usd": 0.01,
    }
    assert_valid("result", with_totals)
    assert errors("result", {**with_totals, "cost_usd": -1}) and errors("result", {**with_totals, "attempts": 0})


def dead_letter(key, headers, payload=b'{"request_id": "r1", "prompt": "hi", "model": "m"}', **kwargs):
    return DeadLetterEntry.from_message(key, payload, headers, partition=2, offset=41, **kwargs)


def test_dead_letters_as_dlqapp_records_them_validate_with_every_field_declared():
    history = json.dumps([attempt(n, "server_error").as_dict() for n in (1, 2, 3, 4)])
    headers = {
        "request_id": "r1",
        "error_class": "server_error",
        "final_error": "gave up after 4 attempts",
        "retry_count": "3",
        "attempts": "4",
        "attempt_history": history,
        "original_timestamp": "1700000000000",
        "dead_at": "1700000071000",
        "source": '{"topic":"input","partition":2,"offset":7}',
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # traces: docs/operations.md
        "tracestate": "vendor=abc",
    }
    entry = dead_letter("r1", headers)
    assert_valid("dead-letter", entry.as_dict())
    assert_valid("dead-letter", {**entry.presented(), "ledger": [], "cost_usd": 0.02})  # GET /dlq/{id}/
    log_line = {k: v for k, v in entry.as_dict().items() if k != "headers"}  # the JSON-lines log
    assert_valid("dead-letter", log_line)
    binary = dead_letter("invalid-" + "0" * 32, {"error_class": "invalid_request"}, payload=b"\xff\xfe")
    assert binary.payload_b64 and binary.payload_text is None
    assert_valid("dead-letter", binary.presented())
    big = dead_letter("r2~invalid_request~0123456789ab", {"request_id": "r2"}, payload=b"x" * 100, max_bytes=10)
    assert big.payload_truncated
    assert_valid("dead-letter", big.as_dict())
    assert errors("dead-letter", {**entry.as_dict(), "dlq": {"partition": 1}})


def test_the_error_classes_listed_are_those_dlqapp_writes():
    listed = set(schema("dead-letter")["properties"]["error_class"]["examples"])
    assert listed == {c.value for c in ErrorClass} - {"replay_limit"}  # declared in core/errors, never written


@pytest.mark.parametrize(
    ("key", "form"),
    [
        ("req-42", "request"),
        ("req-42~invalid_request~0123456789ab", "unprocessable copy"),
        ("req-42~poison~0123456789ab", "unprocessable copy"),
        ("invalid-" + "ab" * 16, "invalid without id"),
        ("poison-0123456789ab", "poison without id"),
    ],
)
def test_the_dead_letter_key_forms_are_told_apart(key, form):
    assert key_form(key) == form
