"""The hand-written fast paths give what the generic code they replace gave."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict

import pytest

from dlqapp.core.envelope import Attempt, Envelope, Result
from dlqapp.observability import metrics
from dlqapp.settings import Settings, SettingsError
from dlqapp.wiring.faust_app import install_event_loop


def test_attempt_history_entry_is_what_asdict_gives():
    attempt = Attempt(attempt=2, at=5, topic="retry-1s", due_ms=4, duration_ms=1, error_class="timeout", error="slow")
    envelope = Envelope("r1", b"{}", 0, {})
    envelope.record(attempt)
    public = {("scheduled" if k == "due_ms" else k): v for k, v in asdict(attempt).items()}  # the history's public name
    assert envelope.history == [public]
    assert list(envelope.history[0]) == list(public)  # same key order in the JSON


def test_result_bytes_are_what_asdict_gives():
    result = Result("r1", "m", "text é", 2, 10, 20, {"k": [1, {"n": None}]}, {"total_tokens": 3}, [{"attempt": 1}])
    expected = {k: v for k, v in asdict(result).items() if k != "output_bytes"}
    assert result.to_bytes() == json.dumps(expected, separators=(",", ":")).encode()
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
