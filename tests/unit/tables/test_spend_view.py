"""The cluster's spend as a worker sees it, and the counters' forgetting of past windows."""

from __future__ import annotations

import json
from collections import Counter

from dlqapp.core.budgets import Budget, BudgetTable
from dlqapp.tables.counters import Counters
from dlqapp.tables.spend_view import SpendView


def test_own_partitions_are_read_locally_and_the_others_from_the_changelog():
    local = {0: {"spend|t|a|2026-12-03": 5}, 1: {"spend|t|a|2026-12-03": 7}}
    view = SpendView(lambda p, name: local.get(p, {}).get(name, 0), lambda: [0, 1], lambda p: local.get(p, {}))
    blob = json.dumps({"received": 3, "spend|t|a|2026-12-03": 100}).encode()
    view.on_record(1, b"p1", json.dumps({"spend|t|a|2026-12-03": 1}).encode())  # owned: the local count wins
    view.on_record(2, b"p2", blob)
    view.on_record(2, b"p2", json.dumps({"spend|t|a|2026-12-03": 40}).encode())  # the newest blob counts
    view.on_record(2, b"p1", blob)  # a key that is not its partition's counts: ignored
    assert view.totals() == {"spend|t|a|2026-12-03": 5 + 7 + 40}
    assert view.spent_here("spend|t|a|2026-12-03") == 12


def test_budgets_set_at_run_time_replace_the_configured_ones_and_a_tombstone_removes_them():
    view = SpendView(lambda p, name: 0, lambda: [])
    changed: list[str] = []
    view.on_budget_change.append(changed.append)
    configured = BudgetTable.parse('{"a": {"day_usd": 1}}')
    view.on_record(0, b"budget|a", json.dumps({"day_usd": 5, "month_usd": None, "set_by": "ops"}).encode())
    view.on_record(0, b"budget|bad name", json.dumps({"day_usd": 5}).encode())  # not a valid key: ignored
    assert view.budgets(configured).for_tenant("a") == Budget(5.0, None)
    assert view.set_budgets()["a"]["set_by"] == "ops" and changed == ["a"]
    view.on_record(0, b"budget|a", None)
    assert view.budgets(configured).for_tenant("a") == Budget(1.0, None)


class _Step:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()


class _Steps:
    def required(self, what: str) -> _Step:
        return _Step()


def test_counters_forget_past_windows_when_a_new_one_is_counted():
    table: dict[bytes, bytes] = {}
    counters = Counters(
        table, _Steps(), read=lambda p, key: None, scan=lambda p, prefix: [], forget=lambda name: name.endswith("|old")
    )
    counters.merge(0, Counter({"spend|t|a|old": 5, "received": 1}))
    counters.merge(0, Counter({"received": 1}))  # no new name: nothing dropped
    assert counters.value(0, "spend|t|a|old") == 5
    counters.merge(0, Counter({"spend|t|a|new": 2}))
    assert counters.value(0, "spend|t|a|old") == 0 and counters.value(0, "received") == 2


def test_spend_under_keys_of_its_own_wins_over_a_blob_written_before_and_a_tombstone_removes_it():
    view = SpendView(lambda p, name: 0, lambda: [])
    name = "spend|t|a|2026-12"
    view.on_record(3, b"p3", json.dumps({"received": 1, name: 10}).encode())  # written before keys of their own
    assert view.totals() == {name: 10}
    view.on_record(3, b"p3|" + name.encode(), b"25")
    view.on_record(4, b"p4|" + name.encode(), b"5")
    view.on_record(4, b"p3|" + name.encode(), b"99")  # not its partition's: ignored
    assert view.totals() == {name: 30}
    view.on_record(3, b"p3", json.dumps({"received": 2}).encode())
    view.on_record(4, b"p4|" + name.encode(), None)
    assert view.totals() == {name: 25}
