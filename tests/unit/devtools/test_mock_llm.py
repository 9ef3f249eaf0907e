"""The mock's per-request failure shares (`--fail-once`, `--fail-always`)."""

from __future__ import annotations

import random

from dlqapp.devtools.mock_behaviour import MockState, parse_mix, request_failure, request_share


def call(state: MockState, request_id: str):
    state.calls[request_id] += 1
    return request_failure(state, request_id)


def test_shares_of_requests_fail_once_or_always_the_same_ids_every_run():
    state = MockState(0, 0, [], 1.0, random.Random(1), once=parse_mix("503=0.2"), always=parse_mix("401=0.01"))
    ids = [f"r{n}" for n in range(20_000)]
    first = {rid: call(state, rid) for rid in ids}
    second = {rid: call(state, rid) for rid in ids}
    once = [rid for rid in ids if first[rid] is not None and second[rid] is None]
    always = [rid for rid in ids if first[rid] is not None and second[rid] is not None]
    assert 0.19 < len(once) / len(ids) < 0.21 and 0.007 < len(always) / len(ids) < 0.013
    assert {first[rid].status for rid in once} == {503} and {second[rid].status for rid in always} == {401}
    assert all(0.2 <= request_share(rid) < 0.21 for rid in always)  # a fixed band of the id's hash
    assert request_failure(MockState(0, 0, [], 1.0, random.Random(1)), "r1") is None  # nothing asked, nothing fails


def test_answers_report_usage_like_a_provider_and_the_ledger_adds_it_up():
    from dlqapp.devtools.mock_behaviour import completion

    state = MockState(0, 0, [], 1.0, random.Random(1), cache_min_tokens=16)
    system = {"role": "system", "content": "s" * 100}  # 25 tokens + 4
    body = {"model": "m", "messages": [system, {"role": "user", "content": "hello there"}], "reasoning_effort": "low"}
    served = []
    for request_id in ("a", "b"):
        answer = completion(request_id, body)
        state.cache(body, answer["usage"])
        state.served(request_id, answer["usage"])
        served.append(answer["usage"])
    first, second = served
    assert first["prompt_tokens"] == 25 + 3 + 8 and first["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["prompt_tokens_details"]["cached_tokens"] == 16  # the prefix's 29 tokens, in steps of 16
    assert first["completion_tokens_details"]["reasoning_tokens"] == 64
    assert (
        first["completion_tokens"] > 64 and first["total_tokens"] == first["prompt_tokens"] + first["completion_tokens"]
    )
    assert state.ledger["prompt"] == 2 * first["prompt_tokens"] and state.ledger["cached"] == 16
    assert state.ledger_by_id["b"]["cached"] == 16
