"""The history checker's rules (tests/history/check.py) on hand-made collected data: each
passes a clean run and fails a run crafted to break it."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import pytest

from tests.history import check
from tests.history import generate as generate_module
from tests.history.generate import NAMED, Event, History, generate

T = 1_800_000_000_000
INPUT = "p.input"


def sha(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()


def src(partition: int, offset: int, topic: str = INPUT) -> str:
    return json.dumps({"topic": topic, "partition": partition, "offset": offset}, separators=(",", ":"))


def outcome(topic: str, key: str, partition: int, offset: int, ts: int, value: bytes | None, **headers: str) -> dict:
    return {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "timestamp": ts,
        "key": key,
        "tombstone": value is None,
        "sha256": None if value is None else sha(value),
        "len": None if value is None else len(value),
        "preview": None,
        "headers": headers,
        "result": None,
    }


R1 = b'{"request_id": "r1", "messages": [{"role": "user", "content": "hi"}]}'
R2 = b'{"request_id": "r2", "messages": [{"role": "user", "content": "hi"}]}'
BAD = b"\xff not json"
HISTORY_R2 = [
    {"attempt": 1, "at": T + 100, "topic": INPUT, "scheduled": None},
    {"attempt": 2, "at": T + 1110, "topic": "p.retry-1s", "scheduled": T + 1100},
]


def produced(kind: str, rid: str | None, partition: int, offset: int, value: bytes | None, valid: bool) -> dict:
    return {
        "event": 0,
        "kind": kind,
        "id": rid,
        "about": rid,
        "key": rid,
        "valid": valid,
        "bad": not valid,
        "null": value is None,
        "sha256": None if value is None else sha(value),
        "len": None if value is None else len(value),
        "partition": partition,
        "offset": offset,
        "timestamp": T,
        "skew_ms": 0,
        "sent_ms": T,
    }


def clean() -> dict[str, Any]:
    """A run where r1 succeeded, r2 failed twice into the DLQ and a non-JSON record was
    dead-lettered with its bytes; one SIGTERM stopped a worker in time."""
    result = outcome("results", "r1", 0, 0, T + 200, b"{}", source=src(0, 0))
    result["result"] = {
        "request_id": "r1",
        "attempts": 1,
        "history": [{"attempt": 1, "at": T + 150, "scheduled": None}],
    }
    return {
        "history": {"events": []},
        "topics": {"input": INPUT, "results": "p.results", "dlq": "p.dlq", "tiers": ["p.retry-1s"]},
        "started_ms": T,
        "produced": [
            produced("request", "r1", 0, 0, R1, True),
            produced("request", "r2", 1, 0, R2, True),
            produced("near_limit", None, 2, 0, BAD, False),
        ],
        "outcomes": [
            result,
            outcome(
                "dlq",
                "r2",
                1,
                0,
                T + 1200,
                R2,
                source=src(1, 0),
                error_class="server_error",
                attempt_history=json.dumps(HISTORY_R2),
            ),
            outcome("dlq", "invalid-abc", 2, 0, T + 300, BAD, source=src(2, 0), error_class="invalid_request"),
        ],
        "replays_on_input": [],
        "tier_counts": {"p.retry-1s": 1},
        "requests": {
            "r1": {"status": 200, "body": {"state": "succeeded", "duplicates": 0, "ledger": [], "history": []}},
            "r2": {"status": 200, "body": {"state": "dead_lettered", "duplicates": 0, "ledger": [], "history": []}},
        },
        "stats": {
            "status": 200,
            "body": {
                "received": 3,
                "succeeded": 1,
                "dead_lettered": {"server_error": 1, "invalid_request": 1},
                "duplicates_skipped": 0,
                "reprocessed": 0,
                "dlq_size": 2,
                "dlq_by_error_class": {"server_error": 1, "invalid_request": 1},
                "retried": {"p.retry-1s": 1},
            },
        },
        "dlq_listing": {"status": 200, "total": 2, "counts": {}, "keys": ["r2", "invalid-abc"]},
        "calls": [
            {"request_id": "r1", "at_ms": T + 150, "status": 200},
            {"request_id": "r2", "at_ms": T + 100, "status": 503},
            {"request_id": "r2", "at_ms": T + 1110, "status": 503},
        ],
        "operator": [],
        "faults": [],
        "sigterms": [
            {
                "worker": "w1",
                "pid": 10,
                "sent_ms": T + 500,
                "exit_s": 1.5,
                "exit_code": 0,
                "bound_s": 10.0,
                "pid_gone": True,
                "restart_lines_after_signal": [],
                "ready_lines_after_signal": 0,
            }
        ],
        "worker_runs": [
            {
                "worker": "w1",
                "pid": 10,
                "started_ms": T - 9000,
                "ended_ms": T + 2000,
                "ended_by": "sigterm",
                "ready_lines": 1,
                "restarts": 0,
                "restart_lines": [],
            },
            {
                "worker": "w1",
                "pid": 11,
                "started_ms": T + 2000,
                "ended_ms": None,
                "ended_by": None,
                "ready_lines": 1,
                "restarts": 0,
                "restart_lines": [],
            },
        ],
        "errors": [],
    }


def broken(c: dict[str, Any], rule: Any) -> set[str]:
    return check.rule_names(rule(c))


def test_a_clean_run_breaks_no_rule():
    assert check.check_all(clean()) == []


def test_a_two_outcomes_of_one_chain():
    c = clean()
    c["outcomes"].append(outcome("dlq", "r1", 0, 1, T + 900, R1, source=src(0, 0), error_class="server_error"))
    assert broken(c, check.rule_a_one_outcome_per_chain) == {"a.one_outcome_per_chain"}
    c["outcomes"][-1]["headers"]["source"] = src(0, 7)  # a chain of its own (a copy sent again)
    assert broken(c, check.rule_a_one_outcome_per_chain) == set()


def replay(c: dict[str, Any], key: str, n: int, **extra: Any) -> None:
    c["operator"].append(
        {
            "event": 0,
            "action": "replay",
            "via": "http",
            "id": key,
            "asked": {"id": key, "force": extra.get("force", False)},
            "asked_ms": T + 2000,
            "answered_ms": T + 2010,
            "status": 200,
            "body": {"request_id": key, "status": "reprocessed", "replay_count": n},
        }
    )


def test_b_a_replay_answered_reprocessed_needs_exactly_one_outcome_with_its_count():
    c = clean()
    replay(c, "r2", 1)
    assert broken(c, check.rule_b_replay_outcome) == {"b.replay_outcome"}
    later = outcome("results", "r2", 1, 5, T + 3000, b"{}", source=src(1, 9), replay_count="1")
    c["outcomes"].append(later)
    assert broken(c, check.rule_b_replay_outcome) == set()
    c["outcomes"].append({**later, "offset": 6})
    assert broken(c, check.rule_b_replay_outcome) == {"b.replay_outcome"}


def test_b_a_bulk_replay_takes_its_counts_from_the_ledger_and_an_invalid_copy_counts_for_its_id():
    c = clean()
    c["operator"].append(
        {
            "event": 0,
            "action": "replay_all",
            "via": "cli",
            "id": None,
            "asked": {"all": True},
            "asked_ms": T + 2000,
            "answered_ms": T + 2100,
            "status": 0,
            "body": {"reprocessed": ["r2~invalid_request~abc"], "not_found": []},
        }
    )
    c["requests"]["r2"]["body"]["ledger"] = [{"action": "replay", "at": T + 2050, "replay_count": 1}]
    assert broken(c, check.rule_b_replay_outcome) == {"b.replay_outcome"}
    c["outcomes"].append(
        outcome("dlq", "r2~invalid_request~def", 1, 7, T + 2500, b"{}", source=src(1, 8), replay_count="1")
    )
    assert broken(c, check.rule_b_replay_outcome) == set()


def test_c_every_valid_id_ends_settled_with_an_outcome_of_its_own():
    c = clean()
    c["requests"]["r2"]["body"]["state"] = "reprocessed"
    assert broken(c, check.rule_c_nothing_lost) == {"c.settled"}
    c = clean()
    c["outcomes"] = [o for o in c["outcomes"] if o["key"] != "r1"]
    assert broken(c, check.rule_c_nothing_lost) == {"c.has_outcome", "c.succeeded_has_result"}
    c = clean()
    c["requests"]["r1"] = {"status": 404, "body": {"error": "unknown"}}
    assert broken(c, check.rule_c_nothing_lost) == {"c.known"}
    c = clean()
    c["outcomes"].append(outcome("dlq", "r2", 1, 9, T + 5000, None))  # its dead letter tombstoned, state unchanged
    assert broken(c, check.rule_c_nothing_lost) == {"c.dead_lettered_has_dead_letter"}


def test_d_no_call_after_the_first_committed_result_unless_forced():
    c = clean()
    c["calls"].append({"request_id": "r1", "at_ms": T + 200 + check.CLOCK_SLACK_MS + 1, "status": 200})
    assert broken(c, check.rule_d_no_call_after_success) == {"d.no_call_after_success"}
    c["calls"][-1]["at_ms"] = T + 200 + check.CLOCK_SLACK_MS  # within the clocks' slack
    assert broken(c, check.rule_d_no_call_after_success) == set()
    c["calls"][-1]["at_ms"] = T + 5000
    replay(c, "r1", 1, force=True)
    assert broken(c, check.rule_d_no_call_after_success) == set()


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("succeeded", 2, "e.succeeded"),
        ("received", 4, "e.received"),
        ("dead_lettered", {"server_error": 1}, "e.dead_lettered"),
        ("dlq_size", 3, "e.dlq_size"),
        ("dlq_by_error_class", {"server_error": 2}, "e.dlq_by_error_class"),
        ("reprocessed", 1, "e.reprocessed"),
        ("retried", {"p.retry-1s": 2}, "e.retried"),
        ("duplicates_skipped", 1, "e.duplicates_skipped"),
    ],
)
def test_e_each_count_must_equal_the_topics(field: str, value: Any, rule: str):
    c = clean()
    c["stats"]["body"][field] = value
    assert broken(c, check.rule_e_counts) == {rule}


def test_e_duplicates_per_id_and_the_dlq_listing():
    c = clean()
    c["produced"].append({**produced("duplicate", "r1", 0, 1, R1, True)})  # skipped: no chain of its own
    assert broken(c, check.rule_e_counts) == {"e.duplicates_skipped"}  # stats and r1 both say 0
    c["stats"]["body"]["duplicates_skipped"] = 1
    c["requests"]["r1"]["body"]["duplicates"] = 1
    assert broken(c, check.rule_e_counts) == set()
    c["dlq_listing"]["keys"] = ["r2"]
    c["dlq_listing"]["total"] = 1
    assert broken(c, check.rule_e_counts) == {"e.dlq_listing_keys", "e.dlq_listing_total"}
    c = clean()
    c["stats"] = {"status": None, "body": "no live worker"}
    assert broken(c, check.rule_e_counts) == {"e.stats"}


def test_e_totals_that_need_every_chain_are_left_to_rule_c_when_one_is_lost():
    c = clean()
    c["requests"]["r2"]["body"]["state"] = "reprocessed"
    c["stats"]["body"]["received"] = 7
    assert broken(c, check.rule_e_counts) == set()


def test_f_a_retry_late_beyond_5_s_unless_a_fault_was_on_meanwhile_and_never_early():
    c = clean()
    history = copy.deepcopy(HISTORY_R2)
    history[1]["at"] = history[1]["scheduled"] + check.LATE_MS + 1
    c["outcomes"][1]["headers"]["attempt_history"] = json.dumps(history)
    assert broken(c, check.rule_f_retries_on_time) == {"f.retry_late"}
    c["faults"].append({"kind": "kill", "start_ms": history[1]["at"] - 100, "end_ms": history[1]["at"] + 8000})
    assert broken(c, check.rule_f_retries_on_time) == set()
    c["faults"][0].update(start_ms=T - 60_000, end_ms=history[1]["scheduled"] - check.FAULT_TAIL_MS - 1)
    assert broken(c, check.rule_f_retries_on_time) == {"f.retry_late"}  # over well before it was due
    history[1]["at"] = history[1]["scheduled"] - 1
    c["outcomes"][1]["headers"]["attempt_history"] = json.dumps(history)
    assert broken(c, check.rule_f_retries_on_time) == {"f.retry_early"}
    c["operator"].append({"action": "run_now", "id": "r2", "via": "http", "event": 0})
    assert broken(c, check.rule_f_retries_on_time) == set()


def test_f_a_budget_hold_of_its_own_tenant_excuses_a_late_retry_until_5_s_after_its_release():
    c = clean()
    history = copy.deepcopy(HISTORY_R2)
    history[1]["at"] = history[1]["scheduled"] + check.LATE_MS + 1
    c["outcomes"][1]["headers"]["attempt_history"] = json.dumps(history)
    r2 = next(p for p in c["produced"] if p["id"] == "r2" and p["valid"])
    r2["tenant"] = "t1"

    def budget(action: str, tenant: str, at: int) -> dict[str, Any]:
        asked = {"tenant": tenant, "day_usd": None, "pair": 0}
        return {
            "action": action,
            "id": None,
            "via": "http",
            "event": 0,
            "asked": asked,
            "asked_ms": at,
            "answered_ms": at,
        }

    c["operator"] += [budget("budget_hold", "t2", T - 1000), budget("budget_release", "t2", T + 60_000)]
    assert broken(c, check.rule_f_retries_on_time) == {"f.retry_late"}  # another tenant's hold
    c["operator"].append(budget("budget_hold", "t1", history[1]["scheduled"] - 10))
    assert broken(c, check.rule_f_retries_on_time) == set()  # held and never released (rule c judges that)
    release = history[1]["scheduled"] - check.FAULT_TAIL_MS - 1
    c["operator"][-1]["asked_ms"] = release - 5000
    c["operator"].append(budget("budget_release", "t1", release))
    assert broken(c, check.rule_f_retries_on_time) == {"f.retry_late"}  # released well before it was due
    c["operator"][-1]["answered_ms"] = history[1]["at"] - 100
    assert broken(c, check.rule_f_retries_on_time) == set()


def test_f_reads_the_history_of_results_too():
    c = clean()
    c["outcomes"][0]["result"]["history"] = [{"attempt": 2, "at": T + 20_000, "scheduled": T + 1000}]
    assert broken(c, check.rule_f_retries_on_time) == {"f.retry_late"}


@pytest.mark.parametrize(
    ("change", "rules"),
    [
        ({"exit_s": None, "exit_code": -9}, {"g.stops"}),
        ({"exit_s": 10.5}, {"g.stops"}),
        (
            {"restart_lines_after_signal": ["restarting the worker ..."], "ready_lines_after_signal": 1},
            {"g.stays_stopped"},
        ),
        ({"pid_gone": False}, {"g.stays_stopped"}),
    ],
)
def test_g_a_sigterm_ends_the_process_within_its_bound_for_good(change: dict, rules: set[str]):
    c = clean()
    c["sigterms"][0].update(change)
    assert broken(c, check.rule_g_stops) == rules


def test_h_at_most_one_restart_in_place_per_fault_injected_while_the_process_ran():
    c = clean()
    c["worker_runs"][1].update(restarts=2, ready_lines=3)
    assert broken(c, check.rule_h_no_restart_loop) == {"h.no_restart_loop"}
    c["faults"] = [
        {"kind": "broker_restart", "start_ms": T + 3000, "end_ms": T + 9000},
        {"kind": "slow_broker", "start_ms": T + 10_000, "end_ms": T + 15_000},
    ]
    assert broken(c, check.rule_h_no_restart_loop) == set()
    c["faults"][1]["kind"] = "sigterm"  # its own stop is no excuse
    c["faults"][1]["worker"] = "w1"
    assert broken(c, check.rule_h_no_restart_loop) == {"h.no_restart_loop"}


def test_i_every_bad_record_has_a_dead_letter_with_its_bytes():
    c = clean()
    c["outcomes"][2]["sha256"] = sha(b"something else")
    assert broken(c, check.rule_i_bad_input_kept) == {"i.bad_input_kept"}
    c = clean()
    c["outcomes"].pop(2)
    assert broken(c, check.rule_i_bad_input_kept) == {"i.bad_input_kept"}
    c = clean()
    c["produced"].append(produced("null", None, 0, 3, None, False))
    assert broken(c, check.rule_i_bad_input_kept) == {"i.bad_input_kept"}
    c["outcomes"].append(outcome("dlq", "invalid-e3b0", 0, 4, T, b"", source=src(0, 3), payload_null="true"))
    assert broken(c, check.rule_i_bad_input_kept) == set()


def test_j_a_worker_that_ends_by_itself():
    c = clean()
    c["worker_runs"][1].update(
        ended_by="crashed", exit_code=1, crash_lines=["[...] [CRITICAL] We experienced a crash!"]
    )
    assert broken(c, check.rule_j_no_crash) == {"j.no_crash"}


def test_k_a_request_that_could_succeed_within_its_tiers_must_end_succeeded():
    c = clean()

    def request(rid: str, plan: dict[str, Any] | None) -> dict[str, Any]:
        return {"at": 0.0, "kind": "request", "args": {"id": rid, "plan": plan}}

    c["history"]["events"] = [request("r1", None), request("r2", {"fail_times": 9, "status": 503})]
    assert broken(c, check.rule_k_planned_to_succeed) == set()
    c["history"]["events"][1]["args"]["plan"]["fail_times"] = 3  # three tiers: the fourth attempt succeeds
    assert broken(c, check.rule_k_planned_to_succeed) == {"k.delayed_never_failed"}
    c["history"]["settings"] = {"DLQ_RETRY_DELAYS": "1s,2s"}
    assert broken(c, check.rule_k_planned_to_succeed) == set()
    c["history"]["events"][1]["args"]["plan"] = {"fail_times": 1, "status": 401}  # final: dead at once
    assert broken(c, check.rule_k_planned_to_succeed) == set()
    c["requests"]["r1"]["body"]["state"] = "dead_lettered"
    assert broken(c, check.rule_k_planned_to_succeed) == {"k.delayed_never_failed"}
    c["history"]["events"].append({"at": 1.0, "kind": "dead_letter_now", "args": {"id": "r1", "via": "http"}})
    assert broken(c, check.rule_k_planned_to_succeed) == set()
    c["history"]["events"].pop()
    c["requests"]["r1"]["body"]["state"] = "budget_held"  # not settled: rule c's to judge
    assert broken(c, check.rule_k_planned_to_succeed) == set()


def test_many_violations_of_one_rule_are_summed_up():
    c = clean()
    for n in range(check.MAX_PER_RULE + 5):
        c["produced"].append(produced("burst", f"b{n}", 0, 100 + n, b"{}", False))
    found = [v for v in check.check_all(c) if v.rule == "i.bad_input_kept"]
    assert len(found) == 1 and "25 violations" in found[0].message


def test_histories_are_seeded_printable_and_replayable():
    assert generate(7).to_json() == generate(7).to_json() != generate(8).to_json()
    for history in [generate(7, "large"), *(make() for make in NAMED.values())]:
        again = History.from_json(history.to_json())
        assert again == history and again.describe() == history.describe()


def test_dropping_a_request_drops_the_events_about_it():
    history = generate(3)
    index = next(i for i, e in enumerate(history.events) if e.kind == "request" and e.target == "r7")
    smaller = history.without({index})
    assert all(e.target != "r7" for e in smaller.events)
    assert len(smaller.events) < len(history.events) - 1  # r7 had a copy and an operator action


def test_budget_holds_come_with_a_tenant_on_every_request_and_shrinking_keeps_each_hold_released():
    history = next(h for h in map(lambda seed: generate(seed, "large"), range(100)) if h.settings.get("DLQ_PRICES"))
    assert all(e.args.get("tenant") for e in history.events if e.kind == "request")
    holds = [i for i, e in enumerate(history.events) if e.kind == "budget_hold"]
    releases = [i for i, e in enumerate(history.events) if e.kind == "budget_release"]
    assert holds and len(holds) == len(releases)
    smaller = history.without(set(releases))
    assert [e.kind for e in smaller.events].count("budget_release") == len(holds)  # a hold keeps its release
    smaller = history.without(set(holds))
    assert [e.kind for e in smaller.events].count("budget_hold") == 0


def test_budgets_leave_the_rest_of_a_seeds_history_as_it_was(monkeypatch):
    """Seeds named in docs/reliability.md before budgets came in still draw their events."""
    with_budgets = [generate(seed, "large") for seed in range(7200, 7220)]
    monkeypatch.setattr(generate_module, "_budgets", lambda rng, events, produce_s: {})
    monkeypatch.setattr(generate_module, "_tail_read", lambda rng, events, produce_s: {})
    for history in with_budgets:
        before = generate_module.generate(history.seed, "large")
        rest = [
            Event(e.at, e.kind, {k: v for k, v in e.args.items() if k != "tenant"})
            for e in history.events
            if e.kind not in ("budget_hold", "budget_release", "flood")
        ]
        assert rest == before.events


def test_shrinking_keeps_the_smallest_history_that_still_breaks_the_gravest_rule(tmp_path):
    from tests.history.shrink import Outcome, shrink

    history = generate(11)
    culprit = next(e for e in history.events if e.kind == "request")

    def rerun(smaller: History, _: int) -> Outcome:
        # fails rule c while the culprit is in; a count drifts whatever remains
        violations = [check.Violation("e.received", "drift")]
        if any(e.kind == "request" and e.target == culprit.target for e in smaller.events):
            violations.append(check.Violation("c.settled", "lost"))
        return Outcome(smaller, {}, violations, tmp_path)

    first = rerun(history, 0)
    assert check.gravest(first.violations) == {"c.settled"}
    shrunk = shrink(first, rerun, budget_s=60, max_runs=200)
    assert [(e.at, e.target) for e in shrunk.smallest.history.events] == [(0.0, culprit.target)]
    assert shrink(first, rerun, budget_s=60, max_runs=2).runs == 2  # bounded
