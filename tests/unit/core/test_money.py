"""Usage, prices, tenants, windows and budget decisions (dlqapp.core.usage, prices, budgets)."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlqapp.core.budgets import (
    Budget,
    BudgetError,
    BudgetTable,
    first_over,
    hold_until,
    is_stale_spend,
    may_name_a_tenant,
    next_roll_ms,
    spend_name,
    spend_names,
    tenant_of,
    window_names,
)
from dlqapp.core.errors import ErrorClass
from dlqapp.core.prices import Price, PriceError, PriceTable, nusd_of, read_prices_setting, usd
from dlqapp.core.requests import Request
from dlqapp.core.usage import Usage, attempt_usage, estimated_prompt_tokens, failed_call_usage


def ms(*args: int) -> int:
    return int(dt.datetime(*args, tzinfo=dt.UTC).timestamp() * 1000)


def request(text: str = "x" * 40) -> Request:
    return Request("r1", "m", [{"role": "user", "content": text}], None, {}, {})


def test_openai_usage_with_cached_and_reasoning_details() -> None:
    usage = Usage.from_openai(
        {
            "prompt_tokens": 1200,
            "completion_tokens": 300,
            "total_tokens": 1500,
            "prompt_tokens_details": {"cached_tokens": 1024},
            "completion_tokens_details": {"reasoning_tokens": 128},
        }
    )
    assert usage == Usage(prompt=1200, completion=300, cached=1024, reasoning=128)
    assert usage.tokens() == {"prompt": 1200, "completion": 300, "cached": 1024}


@pytest.mark.parametrize("raw", [None, {}, "x", {"prompt_tokens": "9"}, {"prompt_tokens": -1}])
def test_no_usage_reported(raw: object) -> None:
    assert Usage.from_openai(raw) is None  # type: ignore[arg-type]


def test_only_a_total_counts_as_prompt_and_cached_never_passes_prompt() -> None:
    assert Usage.from_openai({"total_tokens": 7}) == Usage(prompt=7)
    assert Usage.from_openai({"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}}) == Usage(5, 0, 5)


def test_failed_calls_are_estimated_only_where_the_prompt_may_have_been_read() -> None:
    prompt = estimated_prompt_tokens(request())
    assert prompt == 10 + 4
    assert failed_call_usage(request(), ErrorClass.TIMEOUT) == Usage(prompt=prompt, estimated=True)
    assert failed_call_usage(request(), ErrorClass.SERVER_ERROR).estimated
    assert failed_call_usage(request(), ErrorClass.RATE_LIMITED) == Usage()
    assert failed_call_usage(request(), ErrorClass.AUTH_ERROR) == Usage()
    assert attempt_usage(request(), {"prompt_tokens": 3, "completion_tokens": 4}, ErrorClass.TIMEOUT) == Usage(3, 4)
    assert attempt_usage(request(), None, None) == Usage(prompt=prompt, estimated=True)


def test_usage_adds_up_and_keeps_the_estimate_mark() -> None:
    assert Usage(1, 2, 1, 0) + Usage(3, 4, 0, 2, estimated=True) == Usage(4, 6, 1, 2, estimated=True)


def test_prices_cost_in_nano_dollars() -> None:
    table = PriceTable.parse(json.dumps({"gpt-4o-mini": {"input": 0.15, "cached_input": 0.075, "output": 0.6}}))
    usage = Usage(prompt=1_000_000, completion=1_000_000, cached=400_000)
    # 600k uncached * 0.15 + 400k cached * 0.075 + 1M out * 0.6 = 0.09 + 0.03 + 0.6
    assert table.cost_nusd("gpt-4o-mini", usage) == nusd_of(0.72)
    assert usd(table.cost_nusd("gpt-4o-mini", Usage(prompt=1)) or 0) == 0.00000015
    assert table.cost_nusd("other", usage) is None


def test_prices_default_cached_to_input_and_star_prices_the_rest() -> None:
    table = PriceTable.parse('{"*": {"input": 1, "output": 2}}')
    assert table.price_of("anything") == Price(1.0, 1.0, 2.0)
    assert table.cost_nusd("anything", Usage(prompt=10, completion=10, cached=5)) == 30_000


@pytest.mark.parametrize(
    "text",
    ["[1]", '{"m": 1}', '{"m": {"input": -1, "output": 1}}', '{"m": {"input": 1}}', '{"m": {"in": 1, "output": 1}}'],
)
def test_bad_price_tables(text: str) -> None:
    with pytest.raises(PriceError):
        PriceTable.parse(text)


def test_prices_from_a_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "prices.json"
    path.write_text('{"m": {"input": 2, "output": 8}}')
    assert read_prices_setting(str(path)).price_of("m") == Price(2.0, 2.0, 8.0)
    assert read_prices_setting("@" + str(path)).price_of("m") == Price(2.0, 2.0, 8.0)
    with pytest.raises(PriceError):
        read_prices_setting(str(tmp_path / "missing.json"))


def test_tenant_from_metadata_then_header_then_default() -> None:
    assert tenant_of({"tenant": "acme"}, {"tenant": "other"}, "default") == "acme"
    assert tenant_of({}, {"tenant": "other"}, "default") == "other"
    assert tenant_of({"tenant": 5}, {}, "default") == "default"
    assert tenant_of({"tenant": "a|b c"}, {}, "d") == "a_b_c"
    assert len(tenant_of({"tenant": "x" * 500}, {}, "d")) == 64


@given(
    st.dictionaries(st.sampled_from(["tenant", "team", "job", "tenant_id"]), st.text(max_size=8) | st.integers()),
    st.dictionaries(st.sampled_from(["tenant", "traceparent", "x"]), st.text(max_size=8)),
    st.booleans(),
)
def test_a_request_that_cannot_name_a_tenant_is_the_default_tenants(metadata, headers, ascii_only) -> None:
    """The tail read skips reading a default-tenant request by its bytes alone: never wrongly."""
    payload = json.dumps({"request_id": "r", "messages": [], "metadata": metadata}, ensure_ascii=ascii_only).encode()
    if not may_name_a_tenant(payload, headers):
        assert tenant_of(json.loads(payload)["metadata"], headers, "default") == "default"


def test_a_tenant_in_the_bytes_or_a_tenant_header_may_name_one() -> None:
    assert may_name_a_tenant(b'{"metadata":{"tenant":"a"}}', []) and may_name_a_tenant(b"{}", ["tenant"])
    assert not may_name_a_tenant(None, []) and not may_name_a_tenant(b'{"metadata":{"team":"a"}}', ["x"])


def test_windows_are_utc_days_and_months() -> None:
    now = ms(2026, 12, 31, 23, 59, 59)
    assert window_names(now) == {"day": "2026-12-31", "month": "2026-12"}
    assert next_roll_ms(now) == ms(2027, 1, 1)
    assert spend_names("acme", "m", now) == [
        "spend|t|acme|2026-12-31",
        "spend|t|acme|2026-12",
        "spend|m|m|2026-12-31",
        "spend|m|m|2026-12",
    ]
    assert not is_stale_spend("spend|t|acme|2026-12-30", now)
    assert is_stale_spend("spend|t|acme|2026-12-29", now)
    assert not is_stale_spend("spend|t|acme|2026-11", now)
    assert is_stale_spend("spend|t|acme|2026-10", now)
    assert not is_stale_spend("received", now)


def test_budget_table_star_models_and_bad_entries() -> None:
    table = BudgetTable.parse('{"*": {"day_usd": 1}, "acme": {"month_usd": 10}, "model:gpt-4o": {"day_usd": 5}}')
    assert table.for_tenant("acme") == Budget(None, 10.0)
    assert table.for_tenant("anyone") == Budget(1.0, None)
    assert table.for_model("gpt-4o") == Budget(5.0, None)
    assert table.for_model("other") is None
    assert table.with_entries({"acme": Budget(2.0, None)}).for_tenant("acme") == Budget(2.0, None)
    for bad in ('{"a": {"day": 1}}', '{"a": {"day_usd": -1}}', '{"a b": {"day_usd": 1}}', "[]"):
        with pytest.raises(BudgetError):
            BudgetTable.parse(bad)


def test_first_over_counts_spent_in_flight_and_the_estimate() -> None:
    now = ms(2026, 12, 3, 12)
    table = BudgetTable.parse('{"acme": {"day_usd": 1.0, "month_usd": 5.0}}')
    day = spend_name("t", "acme", "2026-12-03")
    spent = {day: nusd_of(0.6)}
    reserved = {day: nusd_of(0.3)}
    verdict = first_over(
        "acme",
        "m",
        table,
        now_ms=now,
        estimate_nusd=nusd_of(0.1),
        spent=lambda n: spent.get(n, 0),
        reserved=lambda n: reserved.get(n, 0),
    )
    assert verdict is None  # 0.6 + 0.3 + 0.1 = 1.0: exactly the limit
    over = first_over(
        "acme",
        "m",
        table,
        now_ms=now,
        estimate_nusd=nusd_of(0.2),
        spent=lambda n: spent.get(n, 0),
        reserved=lambda n: reserved.get(n, 0),
    )
    assert over is not None and (over.scope, over.window) == ("tenant", "day")
    assert "over its day budget" in over.reason()
    assert (
        first_over("other", "m", table, now_ms=now, estimate_nusd=10**12, spent=lambda n: 0, reserved=lambda n: 0)
        is None
    )


def test_a_held_request_is_looked_at_again_at_the_recheck_the_roll_or_its_deadline() -> None:
    now = ms(2026, 12, 3, 23, 59, 50)
    assert hold_until(now, 30_000, None) == ms(2026, 12, 4)
    assert hold_until(now, 5_000, None) == now + 5_000
    assert hold_until(now, 30_000, now + 1_000) == now + 1_001


def test_each_worker_admits_within_its_share_of_the_budget():
    now = ms(2026, 12, 3, 12)
    table = BudgetTable.parse('{"acme": {"day_usd": 1.0}}')
    day = spend_name("t", "acme", "2026-12-03")
    spent = {day: nusd_of(0.2)}

    def verdict(pending: float, estimate: float, share: float) -> object:
        return first_over(
            "acme",
            None,
            table,
            now_ms=now,
            estimate_nusd=nusd_of(estimate),
            spent=lambda n: spent.get(n, 0),
            reserved=lambda n: nusd_of(pending),
            share=share,
        )

    assert verdict(0.2, 0.1, 0.5) is None  # 0.2 spent here + 0.2 + 0.1 <= 0.5 x 1.0
    over = verdict(0.2, 0.2, 0.5)
    assert over is not None and "this worker's share" in over.reason()
    assert verdict(0.6, 0.2, 1.0) is None  # alone: the whole budget
