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
