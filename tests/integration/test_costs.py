"""Money and tenants through the public contract, against the mock LLM and a real Kafka:
tokens and cost add up to the mock's own ledger of tokens served; a budget holds requests
(budget_held) and releases them when raised at run time, across a restart and two workers."""

from __future__ import annotations

import json
import math

import pytest

from tests.kafka_io import keys_seen, produce, read_topic, read_until_quiet
from tests.support import MockLLM, Worker, http_json, unique, wait_until

PRICE = {"input": 2.0, "cached_input": 0.5, "output": 8.0}
PRICES = json.dumps({"main-model": PRICE})
SYSTEM = {"role": "system", "content": "You answer support tickets briefly and politely. " * 4}


@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    m = MockLLM(tmp_path_factory.mktemp("mock"), args=["--latency-ms", "5", "--cache-min-tokens", "32"]).start()
    yield m
    m.stop()


def body(rid: str, tenant: str | None = None, **extra) -> bytes:
    doc = {
        "request_id": rid,
        "model": "main-model",
        "messages": [SYSTEM, {"role": "user", "content": f"ticket {rid}: my order has not arrived"}],
        **extra,
    }
    if tenant:
        doc["metadata"] = {"tenant": tenant}
    return json.dumps(doc).encode()


def outcomes(worker: Worker, ids: list[str], timeout: float = 120) -> dict[str, dict]:
    topics = [worker.topic("results"), worker.topic("dlq")]
    records = read_topic(worker.bootstrap, topics, lambda r: set(ids) <= keys_seen(r), timeout)
    return {r.key.decode(): {**r.json, "_topic": r.topic} for r in records if r.key and r.key.decode() in ids}


def cost_of(tokens: dict) -> float:
    uncached = tokens["prompt"] - tokens["cached"]
    return (
        uncached * PRICE["input"] + tokens["cached"] * PRICE["cached_input"] + tokens["completion"] * PRICE["output"]
    ) / 1e6


def test_tokens_and_cost_add_up_to_the_mocks_ledger(mock, start_worker):
    worker = start_worker(
        DLQ_INFERENCE="openai",
        DLQ_INFERENCE_URL=mock.api_url,
        DLQ_INFERENCE_TIMEOUT="2s",
        DLQ_RETRY_DELAYS="200ms,400ms,600ms",
        DLQ_PRICES=PRICES,
    )
    ok = [unique("paid") for _ in range(12)]
    flaky = [unique("flaky") for _ in range(3)]
    refused = [unique("refused") for _ in range(2)]
    for rid in flaky:
        mock.plan(request_id=rid, fail_times=1, status=503)  # a 5xx: its usage is estimated, and marked
    for rid in refused:
        mock.plan(request_id=rid, fail_times=9, status=401)  # refused: no tokens, dead-lettered at once
    ids = ok + flaky + refused
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), body(rid, "acme")) for rid in ids])
    found = outcomes(worker, ids)
    served = mock.stats()["tokens"]
    reported = {"prompt": 0, "completion": 0, "cached": 0}
    estimated_prompt = 0
    total_cost = 0.0
    for rid in ids:
        outcome = found[rid]
        entry = None if outcome["_topic"].endswith("results") else dead_letter(worker, rid)
        assert (entry or outcome)["tenant"] == "acme"
        per_attempt = {"prompt": 0, "completion": 0, "cached": 0}
        history = outcome["history"] if entry is None else entry["history"]
        for attempt in history:
            tokens = attempt.get("tokens") or {"prompt": 0, "completion": 0, "cached": 0}
            for kind in per_attempt:
                per_attempt[kind] += tokens[kind]
            if attempt.get("tokens_estimated"):
                estimated_prompt += tokens["prompt"]
            else:
                for kind in reported:
                    reported[kind] += tokens[kind]
                if attempt.get("error_class") is None:  # what the mock served this request, by its own count
                    usage = http_json(mock.url + f"/_mock/usage/{rid}")[1]
                    assert tokens == {k: usage[k] for k in ("prompt", "completion", "cached")}, rid
        if outcome["_topic"].endswith("results"):
            assert outcome["tokens"] == per_attempt, rid  # the result's totals cover every attempt
            assert math.isclose(outcome["cost_usd"], sum(a["cost_usd"] or 0 for a in history), abs_tol=1e-9)
            total_cost += outcome["cost_usd"]
        else:
            assert (
                entry is not None
                and entry["cost_usd"] == 0
                and entry["tokens"] == {"prompt": 0, "completion": 0, "cached": 0}
            )
    assert reported == {k: served[k] for k in ("prompt", "completion", "cached")}
    assert served["cached"] > 0  # the shared system prompt was served from cache after the first call
    assert estimated_prompt > 0 and all(found[rid].get("cost_estimated") for rid in flaky)
    expected = cost_of(reported) + estimated_prompt * PRICE["input"] / 1e6
    assert math.isclose(total_cost, expected, rel_tol=1e-6)

    def money() -> dict:
        return worker.get("/dlq/stats/")[1]["money"]

    wait_until(lambda: math.isclose(money()["cost_usd"], expected, rel_tol=1e-6), 30, "dlq-stats to count the cost")
    assert money()["tokens"]["cached"] == served["cached"]
    _, budgets = worker.get("/budgets/")
    assert math.isclose(budgets["tenants"]["acme"]["day"]["spent_usd"], expected, rel_tol=1e-6)
    _, text = http_json_text(worker.url + "/metrics")
    lines = [line for line in text.splitlines() if line.startswith("dlqapp_cost_usd_total{")]
    assert any('tenant="acme"' in line and 'model="main-model"' in line for line in lines), lines


def dead_letter(worker: Worker, rid: str) -> dict:
    """The DLQ entry, once the dlq agent has recorded it."""
    return wait_until(lambda: (lambda a: a[0] == 200 and a[1])(worker.get(f"/dlq/{rid}/")), 30, f"{rid} recorded")


def http_json_text(url: str) -> tuple[int, str]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read().decode()


def test_a_commit_writes_the_spend_that_moved_not_every_tenants_the_partition_has_seen(mock, start_worker):
    """Spend counters in one blob per partition made every commit rewrite the spend of every
    tenant seen this month: 5,000 tenants wrote about 10 KB of stats changelog per request."""
    worker = start_worker(DLQ_INFERENCE="openai", DLQ_INFERENCE_URL=mock.api_url, DLQ_PRICES=PRICES)
    changelog = f"{worker.app_id}-stats-changelog"
    many = [(unique("many"), f"many-{i}") for i in range(60)]
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), body(rid, tenant)) for rid, tenant in many])
    outcomes(worker, [rid for rid, _ in many])
    before = read_until_quiet(worker.bootstrap, [changelog], 3, None, quiet_s=1.0)
    seen = {partition: max(r.offset for r in before if r.partition == partition) for partition in range(3)}
    solo = [unique("solo") for _ in range(30)]
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), body(rid, "solo")) for rid in solo])
    outcomes(worker, solo)
    after = [
        r
        for r in read_until_quiet(worker.bootstrap, [changelog], 3, None, quiet_s=1.0)
        if r.offset > seen.get(r.partition, -1)
    ]
    written = [(r.key or b"") + b"=" + (r.value or b"") for r in after]
    assert any(b"|solo|" in w for w in written), written[:5]
    assert not [w for w in written if b"many-" in w], "a commit rewrote the spend of tenants that spent nothing in it"
    _, report = worker.get("/budgets/")
    assert {tenant for _, tenant in many} | {"solo"} <= set(report["tenants"])
    assert all(report["tenants"][tenant]["month"]["spent_usd"] > 0 for _, tenant in many)


def test_a_budget_holds_requests_across_a_restart_and_two_workers_until_it_is_raised(mock, make_worker):
    # a call costs about 0.00022 USD here (~100 prompt tokens, a third of them cached, ~16
    # completion); its estimate before the call about 0.00027 (no cache, the whole 16-token budget)
    budget = 0.002
    env = {
        "DLQ_INFERENCE": "openai",
        "DLQ_INFERENCE_URL": mock.api_url,
        "DLQ_PRICES": PRICES,
        "DLQ_BUDGETS": json.dumps({"acme": {"day_usd": budget}}),
        "DLQ_BUDGET_RECHECK": "2s",
        "DLQ_CONCURRENCY": "2",
        "DLQ_ADAPTIVE_CONCURRENCY": "false",
    }
    first = make_worker(env_extra=env).start()
    second = make_worker(app_id=first.app_id, prefix=first.prefix, env_extra=env).start()
    wait_until(
        lambda: all(w.get("/")[1]["assigned_partitions"] and w.get("/")[1]["ready"] for w in (first, second)),
        90,
        "both workers to own partitions",
    )
    acme = [unique("acme") for _ in range(20)]
    other = [unique("beta") for _ in range(4)]
    small = {"params": {"max_tokens": 16}}
    produce(
        first.bootstrap,
        first.topic("input"),
        [(rid.encode(), body(rid, "acme", **small)) for rid in acme]
        + [(rid.encode(), body(rid, "beta", **small)) for rid in other],
    )
    done = outcomes(first, other)  # another tenant is not held by acme's budget
    assert all(done[rid]["_topic"].endswith("results") for rid in other)

    def states() -> dict[str, str]:
        return {rid: (first.get(f"/requests/{rid}/")[1] or {}).get("state") for rid in acme}

    wait_until(
        lambda: set(states().values()) <= {"succeeded", "budget_held"} and "budget_held" in states().values(),
        90,
        "acme's requests to succeed or be held",
    )
    held = [rid for rid, state in states().items() if state == "budget_held"]
    paid = [rid for rid in acme if rid not in held]
    assert paid, "some of acme's requests fit the budget"
    assert all(mock.calls(rid) == 0 for rid in held)  # held, never called
    status, one = first.get(f"/requests/{held[0]}/")
    assert "over its day budget" in one["held_because"] and one["attempts"] == 0

    def spent(worker: Worker) -> float:
        return worker.get("/budgets/")[1]["tenants"]["acme"]["day"]["spent_usd"]

    wait_until(lambda: spent(first) == spent(second) > 0, 30, "both workers to see the same spend")
    # each worker admits within its share of what it sees left: together they stay within the
    # budget however late they see each other's spend (5 %: a call may cost a little more than
    # its estimate; the mock answers a token past max_tokens)
    assert spent(first) <= budget * 1.05
    stats = first.get("/dlq/stats/")[1]
    assert stats["budget_held"] == len(held) and stats["dead_lettered"] == {}
    assert first.get("/health/")[1]["total"]["budget_held"] == len(held)

    # a restart (kill -9) forgets nothing: the spend is the same on both workers, still within
    # the budget, and what is still held was never called (while the first worker was away the
    # second owned every partition: its share was the whole budget, so it may have run a few)
    first.kill()
    first.start()
    wait_until(lambda: first.get("/")[1]["ready"] and first.get("/")[1]["assigned_partitions"], 90, "a restart")
    wait_until(lambda: spent(first) == spent(second) > 0, 60, "the restarted worker to see the same spend")
    assert spent(first) <= budget * 1.05
    # a request the second worker is calling right now still reads budget_held until its result
    wait_until(lambda: first.get("/")[1]["in_flight"] == second.get("/")[1]["in_flight"] == 0, 30, "no call in flight")
    still = [rid for rid in held if (second.get(f"/requests/{rid}/")[1] or {}).get("state") == "budget_held"]
    assert still, "a budget holds requests across a restart"
    assert all(mock.calls(rid) == 0 for rid in still)
    held = still

    # raised at run time through one worker: every held request runs, once, with no attempt lost
    status, answer = http_json(second.url + "/budgets/", "POST", {"tenant": "acme", "day_usd": 10})
    assert status == 200 and answer["status"] == "set", answer
    wait_until(lambda: first.get("/budgets/")[1]["tenants"]["acme"]["day"]["limit_usd"] == 10, 30, "the new budget")
    released = outcomes(first, held, timeout=120)
    assert all(released[rid]["_topic"].endswith("results") and released[rid]["attempts"] == 1 for rid in held)
    assert all(mock.calls(rid) == 1 for rid in acme)  # every request called once: no hold cost an attempt
    assert first.get("/budgets/")[1]["set_at_run_time"]["acme"]["day_usd"] == 10


def test_a_tenant_behind_another_tenants_flood_is_served_within_a_round_with_the_default_read_ahead(make_worker):
    """Fair shares past a flood (DLQ_READ_AHEAD, DLQ_READ_AHEAD_BYTES defaults): tenant B's
    requests, produced after tenant A's 300 in every partition, are read ahead of the slots
    and served in B's fair turn, before most of A's backlog; A loses nothing."""
    worker = make_worker(
        env_extra={
            "DLQ_SIMULATED_SUCCESS_RATE": "1.0",
            "DLQ_SIMULATED_LATENCY": "100ms",
            "DLQ_SIMULATED_JITTER": "0ms",
            "DLQ_CONCURRENCY": "4",
            "DLQ_ADAPTIVE_CONCURRENCY": "false",
        }
    ).start()
    flood = [unique("flood-a") for _ in range(300)]
    trickle = [unique("turn-b") for _ in range(3)]
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), body(rid, "a")) for rid in flood])
    produce(worker.bootstrap, worker.topic("input"), [(rid.encode(), body(rid, "b")) for rid in trickle])
    ids = flood + trickle
    records = read_topic(worker.bootstrap, worker.topic("results"), lambda r: set(ids) <= keys_seen(r), 180)
    done_at = {r.key.decode(): r.timestamp for r in records if r.key}
    a_done = sorted(done_at[rid] for rid in flood)
    assert set(ids) <= done_at.keys()
    # 300 calls at 4 in flight take 7.5 s; B's turn comes within a round of 4 calls, not after A's backlog
    assert max(done_at[rid] for rid in trickle) < a_done[len(a_done) // 4]
