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


def test_the_call_log_keeps_each_call_with_its_arrival_time_and_answer_only_when_asked():
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from dlqapp.devtools.mock_behaviour import CallLog, Plan
    from dlqapp.devtools.mock_llm import build_app

    async def run(state: MockState) -> tuple[list[dict], bool]:
        async with TestClient(TestServer(build_app(state))) as client:
            for _ in range(2):
                await client.post(
                    "/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "hi"}]},
                    headers={"X-Request-ID": "a"},
                )
            await client.post("/v1/chat/completions", json={"messages": []}, headers={"X-Request-ID": "b"})
            one = await (await client.get("/_mock/call-log?request_id=a")).json()
            everything = await (await client.get("/_mock/call-log")).json()
            assert len(everything["calls"]) == (3 if everything["enabled"] else 0)
            return one["calls"], one["enabled"]

    ticks = iter(range(1000, 2000))
    state = MockState(0, 0, [], 1.0, random.Random(1), call_log=CallLog(clock=lambda: next(ticks)))
    state.plans["a"] = Plan(remaining=1, status=503)
    calls, enabled = asyncio.run(run(state))
    assert enabled and calls == [
        {"request_id": "a", "at_ms": 1_000_000, "status": 503},
        {"request_id": "a", "at_ms": 1_001_000, "status": 200},
    ]
    assert asyncio.run(run(MockState(0, 0, [], 1.0, random.Random(1)))) == ([], False)
