"""What a replay would cost, from recorded usage where known (dlqapp.deadletters.estimate, api.replays)."""

from __future__ import annotations

import json

from dlqapp.api.replays import money_of
from dlqapp.deadletters.estimate import replay_tokens


def test_recorded_usage_of_an_answered_attempt_is_used_first():
    history = [
        {"attempt": 1, "tokens": {"prompt": 40, "completion": 0, "cached": 0}, "tokens_estimated": True},
        {"attempt": 2, "tokens": {"prompt": 900, "completion": 12, "cached": 512}},
        {"attempt": 3, "tokens": {"prompt": 0, "completion": 0, "cached": 0}},  # refused: no usage
    ]
    replay = replay_tokens(history, json.dumps({"prompt": "x" * 40}), 50)
    assert (replay.prompt, replay.completion, replay.cached, replay.recorded) == (900, 12, 512, True)


def test_without_recorded_usage_the_estimate_counts_the_prompt_and_the_completion_budget():
    payload = json.dumps({"messages": [{"role": "user", "content": "y" * 80}], "params": {"max_tokens": 50}})
    replay = replay_tokens([{"attempt": 1, "tokens_estimated": True, "tokens": {"prompt": 24}}], payload, 90)
    assert (replay.prompt, replay.completion, replay.recorded) == (20 + 4, 50, False)
    assert replay_tokens([], "not json", 400).completion == 256


def test_the_workers_shares_add_up_and_say_where_the_figures_come_from():
    share = {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "cached_tokens": 0,
        "nusd": 1500,
        "spent_nusd": 3000,
        "from_recorded_usage": 1,
        "from_estimate": 2,
        "unpriced": 0,
    }
    money = money_of([{"money": share}, {"money": share}], 1.5)
    assert money["tokens"] == {"prompt": 30, "completion": 15, "cached": 0}
    assert money["cost_usd"] == 4.5e-6 and money["spent_so_far_usd"] == 9e-6
    assert (money["from_recorded_usage"], money["from_estimate"]) == (3, 6) and "from_estimate" in money["method"]
