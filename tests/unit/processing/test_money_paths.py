"""Tokens, cost and budgets on the request path, over in-memory fakes (docs/costs.md)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from prometheus_client import REGISTRY

from dlqapp.core.backend import InferenceOutput
from dlqapp.core.budgets import Budget, spend_name
from dlqapp.core.errors import ErrorClass, InferenceError
from dlqapp.core.prices import nusd_of
from dlqapp.core.record import Record
from dlqapp.core.requests import validate_request
from dlqapp.processing.spend import Reservation
from tests.unit.fakes import FakeMessage, ScriptedBackend, consumed, request, state_of, worker

PRICES = json.dumps({"m": {"input": 1.0, "cached_input": 0.5, "output": 4.0}})
USAGE = {
    "prompt_tokens": 1000,
    "completion_tokens": 200,
    "prompt_tokens_details": {"cached_tokens": 400},
    "completion_tokens_details": {"reasoning_tokens": 50},
}
COST = nusd_of((600 * 1.0 + 400 * 0.5 + 200 * 4.0) / 1e6)


class UsageBackend(ScriptedBackend):
    """Reports USAGE on every success; failures report nothing."""

    async def complete(self, request: Any, attempt: int, model: str | None = None) -> InferenceOutput:
        self.calls[request.request_id] += 1
        if self.calls[request.request_id] <= self.fail_times.get(request.request_id, 0):
            raise InferenceError(self.error, f"scripted {self.error.value}")
        return InferenceOutput(text="answer", model=model or request.model or "m", usage=USAGE)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def event(request_id: str, offset: int = 0, **extra: Any) -> Record:
    return consumed(request_id.encode(), request(request_id, **extra), message=FakeMessage("input", 0, offset))


def test_a_result_totals_every_attempt_and_the_counts_and_history_agree(tmp_path):
    w = worker(tmp_path, UsageBackend({"r1": 1}), DLQ_PRICES=PRICES)
    run(w.pipeline.on_input(event("r1", model="m", metadata={"tenant": "acme"}), w.input))
    key = next(iter(w.parked_table))
    w.clock.now += 1000
    run(w.scheduler.on_due(consumed(b"r1", key, message=FakeMessage("due"))))
    result = json.loads(w.results.sent[0][1])
    first, second = result["history"]
    estimated_prompt = first["tokens"]["prompt"]
    assert first["tokens_estimated"] is True and first["error_class"] == "server_error" and estimated_prompt > 0
    assert second["tokens"] == {"prompt": 1000, "completion": 200, "cached": 400} and second["reasoning_tokens"] == 50
    assert result["tokens"] == {"prompt": 1000 + estimated_prompt, "completion": 200, "cached": 400}
    estimate_cost = nusd_of(estimated_prompt * 1.0 / 1e6)
    assert result["cost_usd"] == round((COST + estimate_cost) / 1e9, 9) and result["cost_estimated"] is True
    assert result["tenant"] == "acme"
    counts = w.counts
    assert counts["cost_nusd"] == COST + estimate_cost
    assert counts["tokens|prompt"] == 1000 + estimated_prompt and counts["tokens|cached"] == 400
    day = next(n for n in counts if n.startswith("spend|t|acme|") and len(n) == len("spend|t|acme|2026-01-01"))
    assert counts[day] == COST + estimate_cost


def test_a_dead_letter_carries_what_was_spent_and_counts_it_as_failed_money(tmp_path):
    w = worker(tmp_path, UsageBackend({"r2": 1}, error=ErrorClass.CONTENT_FILTER), DLQ_PRICES=PRICES)
    run(w.pipeline.on_input(event("r2", model="m"), w.input))
    ((_, _, headers, _),) = w.dlq.sent
    w_entry = headers["spent"]
    assert json.loads(w_entry)["e"] == 1 and json.loads(w_entry)["n"] > 0
    assert w.counts["cost_failed|content_filter"] == json.loads(w_entry)["n"]


def test_an_unpriced_model_is_counted_in_tokens_and_flagged(tmp_path):
    w = worker(tmp_path, UsageBackend(), DLQ_PRICES=PRICES)
    run(w.pipeline.on_input(event("r3", model="other"), w.input))
    result = json.loads(w.results.sent[0][1])
    assert result["unpriced"] is True and result["cost_usd"] == 0 and result["tokens"]["prompt"] == 1000
    assert w.counts["unpriced_attempts"] == 1


def test_a_request_over_its_budget_is_held_without_a_call_then_released_when_the_budget_is_raised(tmp_path):
    budgets = json.dumps({"acme": {"day_usd": 0.0001}})
    w = worker(tmp_path, UsageBackend(), DLQ_PRICES=PRICES, DLQ_BUDGETS=budgets, DLQ_BUDGET_RECHECK="30s")
    run(w.pipeline.on_input(event("r4", model="m", metadata={"tenant": "acme"}), w.input))
    state = state_of(w, "r4")
    assert state["state"] == "budget_held" and w.backend.calls_for("r4") == 0 and w.results.sent == []
    assert "over its day budget" in state["held_because"] and state["attempts"] == 0
    assert w.counts["budget_held_now"] == 1 and w.counts["budget_holds"] == 1
    # a copy arriving meanwhile is a duplicate, not a second chain
    run(w.pipeline.on_input(event("r4", offset=1, model="m", metadata={"tenant": "acme"}), w.input))
    assert state_of(w, "r4")["duplicates"] == 1
    (key,) = list(w.parked_table)
    # still over at the re-check: held again, under a later key
    w.clock.now += 30_000
    run(w.scheduler.on_due(consumed(b"r4", key, message=FakeMessage("due"))))
    assert w.backend.calls_for("r4") == 0 and state_of(w, "r4")["state"] == "budget_held"
    (key,) = list(w.parked_table)
    w.spend_view.on_record(0, b"budget|acme", json.dumps({"day_usd": 10.0}).encode())  # POST /budgets/
    w.clock.now += 30_000
    run(w.scheduler.on_due(consumed(b"r4", key, message=FakeMessage("due"))))
    result = json.loads(w.results.sent[0][1])
    assert result["attempts"] == 1 and w.backend.calls_for("r4") == 1 and list(w.parked_table) == []
    assert w.counts["budget_held_now"] == 0 and w.counts["failed"] == 0
    assert w.spend_view.budgets(w.settings.budgets).for_tenant("acme") == Budget(10.0, None)


def test_a_held_request_still_expires_at_its_deadline(tmp_path):
    budgets = json.dumps({"*": {"day_usd": 0}})
    w = worker(tmp_path, UsageBackend(), DLQ_PRICES=PRICES, DLQ_BUDGETS=budgets)
    deadline = w.clock.now + 5_000
    run(w.pipeline.on_input(event("r5", model="m", deadline=deadline), w.input))
    (key,) = list(w.parked_table)
    assert int.from_bytes(key[:8], "big") == deadline + 1
    w.clock.now = deadline + 1
    run(w.scheduler.on_due(consumed(b"r5", key, message=FakeMessage("due"))))
    ((_, _, headers, _),) = w.dlq.sent
    assert headers["error_class"] == "expired" and w.backend.calls_for("r5") == 0


def test_the_budget_counts_calls_admitted_and_not_yet_accounted(tmp_path):
    budgets = json.dumps({"acme": {"day_usd": 0.003}})
    w = worker(tmp_path, UsageBackend(), DLQ_PRICES=PRICES, DLQ_BUDGETS=budgets)
    spending = w.spending

    req = validate_request({"request_id": "x", "prompt": "hi", "model": "m", "params": {"max_tokens": 100}})

    async def admit_many() -> list[Any]:
        return [await spending.admit(req, "acme", "m") for _ in range(10)]

    admitted = [v for v in run(admit_many()) if isinstance(v, Reservation)]
    assert len(admitted) == nusd_of(0.003) // spending.estimate_nusd(req, "m") < 10
    for reservation in admitted:
        reservation.release()
    assert sum(spending.pending.values()) == 0


def test_a_budget_set_at_run_time_is_a_stats_record_every_worker_reads_and_releases_the_held(tmp_path):
    budgets = json.dumps({"*": {"day_usd": 0}})
    w = worker(tmp_path, UsageBackend(), DLQ_PRICES=PRICES, DLQ_BUDGETS=budgets)
    run(w.pipeline.on_input(event("r6", model="m", metadata={"tenant": "beta"}), w.input))
    assert state_of(w, "r6")["state"] == "budget_held"
    answer = run(
        w.operator.execute({"action": "set_budget", "request_id": "beta", "actor": "ops", "payload": {"day_usd": 1}})
    )
    assert answer["status"] == "set" and answer["budget"]["day_usd"] == 1.0
    stored = w.topology.stats[b"budget|beta"]
    w.spend_view.on_record(0, b"budget|beta", stored)  # what the changelog follower hands every worker
    report = w.spending.report()
    assert (
        report["tenants"]["beta"]["day"]["limit_usd"] == 1.0 and report["tenants"]["beta"]["budget_from"] == "run time"
    )
    (key,) = list(w.parked_table)
    run(w.scheduler.hand_over_now(key, 0))  # what a budget change does for each held request (release_held)
    run(w.scheduler.on_due(consumed(b"r6", key, {"run_now": b"true"}, message=FakeMessage("due"))))
    assert json.loads(w.results.sent[0][1])["tenant"] == "beta"
    bad = run(w.operator.execute({"action": "set_budget", "request_id": "beta", "actor": "o", "payload": {"day": 1}}))
    assert bad["status"] == "invalid"


def test_budget_bodies_of_the_api():
    import pytest

    from dlqapp.api.http import ApiError, budget_of

    assert budget_of({"tenant": "acme", "day_usd": 5}) == ("acme", {"day_usd": 5, "month_usd": None})
    assert budget_of({"model": "gpt-4o", "month_usd": 9}) == ("model:gpt-4o", {"day_usd": None, "month_usd": 9})
    for body in ({}, {"tenant": "a", "model": "b"}, {"tenant": ""}, {"tenant": "a", "limit": 1}):
        with pytest.raises(ApiError):
            budget_of(body)


def test_tenants_past_the_metrics_limit_share_one_label_unless_named_in_the_settings(tmp_path):
    """A `tenant` label per end user would swamp Prometheus (5,000 tenants: a 1.1 MB scrape)."""
    tag = uuid.uuid4().hex[:8]  # the registry is the process's
    weights = json.dumps({f"{tag}-vip": 2})
    w = worker(tmp_path, UsageBackend({}), DLQ_PRICES=PRICES, DLQ_METRICS_TENANTS="1", DLQ_TENANT_WEIGHTS=weights)
    for i, tenant in enumerate([f"{tag}-a", f"{tag}-b", f"{tag}-c", f"{tag}-vip", f"{tag}-a"]):
        run(w.pipeline.on_input(event(f"{tag}-r{i}", offset=i, model="m", metadata={"tenant": tenant}), w.input))

    def prompt_tokens(label: str) -> float:
        labels = {"model": "m", "kind": "prompt", "outcome": "succeeded", "error_class": "none", "tenant": label}
        return REGISTRY.get_sample_value("dlqapp_tokens_total", labels) or 0.0

    assert prompt_tokens(f"{tag}-a") == 2000, "the first tenant counted has its own label"
    assert prompt_tokens(f"{tag}-vip") == 1000, "a tenant named in the settings always has its own"
    assert prompt_tokens(f"{tag}-b") == prompt_tokens(f"{tag}-c") == 0
    assert prompt_tokens("_other") >= 2000


def test_a_model_name_with_a_lone_surrogate_is_refused_and_its_partition_goes_on(tmp_path):
    """Valid JSON, not UTF-8: as a spend counter's key of its own it broke every later write
    of its partition, and as a metric label every /metrics scrape."""
    prices = json.dumps({"*": {"input": 1.0, "cached_input": 0.5, "output": 4.0}})
    w = worker(tmp_path, UsageBackend({}), DLQ_PRICES=prices, DLQ_PROCESSING_GUARANTEE="at_least_once")
    run(w.pipeline.on_input(event("odd-model", offset=0, model="gpt\ud800"), w.input))
    run(w.pipeline.on_input(event("plain-model", offset=1, model="m"), w.input))
    assert [json.loads(value)["request_id"] for _, value, _, _ in w.results.sent] == ["plain-model"]
    ((_, _, headers, _),) = w.dlq.sent
    assert headers["error_class"] == "invalid_request" and "surrogate" in headers["final_error"]
    assert spend_name("m", "gpt\ud800", "2026-12").encode() == b"spend|m|gpt?|2026-12"


def test_models_past_the_metrics_limit_share_one_label_unless_named_in_the_settings(tmp_path):
    tag = uuid.uuid4().hex[:8]  # the registry is the process's
    prices = json.dumps(
        {f"{tag}-priced": {"input": 1.0, "cached_input": 0.5, "output": 4.0}, "*": {"input": 1.0, "output": 1.0}}
    )
    w = worker(tmp_path, UsageBackend({}), DLQ_PRICES=prices, DLQ_METRICS_MODELS="1")
    for i, model in enumerate([f"{tag}-a", f"{tag}-b", f"{tag}-priced", f"{tag}-c"]):
        run(w.pipeline.on_input(event(f"{tag}-r{i}", offset=i, model=model), w.input))

    def prompt_tokens(label: str) -> float:
        labels = {"model": label, "kind": "prompt", "outcome": "succeeded", "error_class": "none", "tenant": "default"}
        return REGISTRY.get_sample_value("dlqapp_tokens_total", labels) or 0.0

    assert prompt_tokens(f"{tag}-a") == 1000 and prompt_tokens(f"{tag}-priced") == 1000
    assert prompt_tokens(f"{tag}-b") == prompt_tokens(f"{tag}-c") == 0 and prompt_tokens("_other") >= 2000
