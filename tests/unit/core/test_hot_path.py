"""The hand-written fast paths give what the generic code they replace gave."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict

import pytest

from dlqapp.core.envelope import Attempt, Envelope, Result
from dlqapp.observability import metrics
from dlqapp.settings import Settings, SettingsError
from dlqapp.wiring.process import install_event_loop


def test_attempt_history_entry_is_what_asdict_gives():
    attempt = Attempt(attempt=2, at=5, topic="retry-1s", due_ms=4, duration_ms=1, error_class="timeout", error="slow")
    envelope = Envelope("r1", b"{}", 0, {})
    envelope.record(attempt)
    public = {
        ("scheduled" if k == "due_ms" else k): v  # the history's public name
        for k, v in asdict(attempt).items()
        if k not in ("usage", "cost_nusd", "model")  # shown only when the attempt has a usage
    }
    assert envelope.history == [public]
    assert list(envelope.history[0]) == list(public)  # same key order in the JSON


def test_result_bytes_are_what_asdict_gives():
    result = Result("r1", "m", "text é", 2, 10, 20, {"k": [1, {"n": None}]}, {"total_tokens": 3}, [{"attempt": 1}])
    expected = {k: v for k, v in asdict(result).items() if k not in ("output_bytes", "spent", "tenant")}
    written = json.loads(result.to_bytes())
    assert written == expected
    assert list(written) == list(expected)  # the fields in declaration order
    result.output_bytes = 99  # an output cut to fit the results topic says so
    assert json.loads(result.to_bytes())["output_truncated"] is True


def test_cached_labels_return_the_registered_child():
    first = metrics.attempts.labels("hot-path-test")
    first.inc()
    assert metrics.attempts.labels("hot-path-test") is first
    assert metrics.attempts.labels(tier="hot-path-test") is first  # named labels still work
    assert metrics.attempts.labels("hot-path-test")._value.get() >= 1


def test_event_loop_setting():
    assert Settings.from_env({}).event_loop == "uvloop"
    with pytest.raises(SettingsError, match="DLQ_EVENT_LOOP"):
        Settings.from_env({"DLQ_EVENT_LOOP": "trio"})
    policy = asyncio.get_event_loop_policy()
    try:
        install_event_loop(Settings.from_env({"DLQ_EVENT_LOOP": "uvloop"}))
        assert type(asyncio.get_event_loop_policy()).__module__.startswith("uvloop")
    finally:
        asyncio.set_event_loop_policy(policy)


def test_an_attempt_with_usage_shows_its_tokens_and_cost_and_the_envelope_adds_them_up():
    from dlqapp.core.prices import Spent
    from dlqapp.core.usage import Usage

    envelope = Envelope("r1", b"{}", 0, {})
    envelope.record(Attempt(1, 5, "input", usage=Usage(10, 0, 0, estimated=True), cost_nusd=100, model="m"))
    envelope.record(Attempt(2, 6, "retry-1s", usage=Usage(20, 5, 8, 2), cost_nusd=None, model="m"))
    assert envelope.history[0]["tokens"] == {"prompt": 10, "completion": 0, "cached": 0}
    assert envelope.history[0]["tokens_estimated"] is True and envelope.history[0]["cost_usd"] == 1e-7
    assert envelope.history[1]["cost_usd"] is None and envelope.history[1]["reasoning_tokens"] == 2
    assert envelope.spent == Spent(Usage(30, 5, 8, 2, estimated=True), 100, unpriced=True)
    again = Envelope.from_bytes(envelope.to_bytes())
    assert again.spent == envelope.spent
    assert Spent.decode("not json") == Spent() and Spent.decode('{"p": -1, "n": "x"}') == Spent()
