"""Tenants, their budgets, and the day and month windows spend is counted in (pure).

`DLQ_BUDGETS` is a JSON object: tenant (or `*`, every tenant without an entry of its own,
each on its own) -> `{"day_usd": x, "month_usd": y}`, either limit optional; keys
`model:<name>` (or `model:*`) bound the spend on a model, all tenants together.
Budgets set at run time (`POST /budgets/`) replace the entry of their key.

Windows are UTC calendar days (`2026-12-03`) and months (`2026-12`); a window rolls at
00:00 UTC. Spend is counted per window under stats counter names (`spend_name`), in
nano-dollars, so every partition's running counts carry it.

A call is admitted when the spend of the partitions this worker owns, plus the estimated
cost of the calls it admitted and has not yet accounted, plus its own estimate, stays within
its share of the limit (`first_over`): `spent here + pending + estimate <= share * limit`,
`share` being its input partitions / all. Spend is counted per partition and the shares add
up to one, so the workers together stay within the limit without seeing each other's calls.
Otherwise the request is held until the window rolls, the budget is raised, or its deadline
passes.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dlqapp.core.prices import nusd_of, usd

ANY_TENANT = "*"
MODEL_PREFIX = "model:"
TENANT_HEADER = "tenant"
"""A request whose metadata names no tenant may name one in this Kafka header."""
MAX_TENANT_CHARS = 64
_TENANT_CHARS = re.compile(r"[^A-Za-z0-9._:@/-]")

WINDOWS = ("day", "month")
SPEND = "spend"
"""Counter name prefix: `spend|<scope>|<name>|<window>` (scope `t` tenant, `m` model)."""


class BudgetError(ValueError):
    """DLQ_BUDGETS (or a budget set at run time) is not valid."""


def clean_tenant(value: Any) -> str | None:
    """A tenant name as dlqapp keeps it (at most 64 characters of `A-Za-z0-9._:@/-`, others
    replaced by `_`), or None when `value` names none."""
    if not isinstance(value, str) or not value.strip():
        return None
    return _TENANT_CHARS.sub("_", value.strip())[:MAX_TENANT_CHARS]


def tenant_of(metadata: Mapping[str, Any], headers: Mapping[str, str], default: str) -> str:
    """The request's tenant: `metadata.tenant`, else the `tenant` header, else `default`."""
    return clean_tenant(metadata.get("tenant")) or clean_tenant(headers.get(TENANT_HEADER)) or default


def may_name_a_tenant(payload: bytes | None, header_names: Iterable[str]) -> bool:
    """Whether a raw request could name a tenant: `tenant` in its bytes, or a `tenant` header.
    When not, it is the default tenant's, known without reading it."""
    return (payload is not None and b"tenant" in payload) or TENANT_HEADER in header_names


# -- windows ---------------------------------------------------------------------------


def _utc(now_ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(now_ms / 1000, tz=dt.UTC)


def window_names(now_ms: int) -> dict[str, str]:
    """`{"day": "2026-12-03", "month": "2026-12"}` for the UTC time `now_ms`."""
    at = _utc(now_ms)
    return {"day": at.strftime("%Y-%m-%d"), "month": at.strftime("%Y-%m")}


def next_roll_ms(now_ms: int) -> int:
    """The next 00:00 UTC after `now_ms` (when the day window, and maybe the month's, rolls)."""
    at = _utc(now_ms)
    midnight = dt.datetime(at.year, at.month, at.day, tzinfo=dt.UTC) + dt.timedelta(days=1)
    return int(midnight.timestamp() * 1000)


def spend_name(scope: str, name: str, window: str) -> str:
    """The counter of `scope` (`t` tenant, `m` model) `name` in `window` (a window name).

    A model name comes from the request as is: a lone surrogate (valid in JSON, not in UTF-8)
    is replaced, as the counter's name is a key of its own (dlqapp.tables.counters)."""
    if not name.isascii():
        name = name.encode("utf-8", "replace").decode("utf-8")
    return f"{SPEND}|{scope}|{name}|{window}"


def spend_names(tenant: str, model: str | None, now_ms: int) -> list[str]:
    """The counters one attempt's cost adds to: its tenant's and its model's, day and month."""
    windows = window_names(now_ms).values()
    names = [spend_name("t", tenant, w) for w in windows]
    if model:
        names += [spend_name("m", model, w) for w in windows]
    return names


def is_stale_spend(name: str, now_ms: int) -> bool:
    """A spend counter of a window before yesterday or before last month: no longer needed."""
    if not name.startswith(SPEND + "|"):
        return False
    window = name.rsplit("|", 1)[-1]
    at = _utc(now_ms)
    if len(window) == 10:  # a day
        keep = {at.strftime("%Y-%m-%d"), (at - dt.timedelta(days=1)).strftime("%Y-%m-%d")}
    else:
        first = dt.datetime(at.year, at.month, 1, tzinfo=dt.UTC)
        keep = {at.strftime("%Y-%m"), (first - dt.timedelta(days=1)).strftime("%Y-%m")}
    return window not in keep


# -- budgets ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits in US dollars; None: no limit on that window."""

    day_usd: float | None = None
    month_usd: float | None = None

    def limit_nusd(self, window: str) -> int | None:
        value = self.day_usd if window == "day" else self.month_usd
        return None if value is None else nusd_of(value)

    def as_dict(self) -> dict[str, float | None]:
        return {"day_usd": self.day_usd, "month_usd": self.month_usd}

    @classmethod
    def parse(cls, key: str, entry: Any) -> Budget:
        if not isinstance(entry, dict):
            raise BudgetError(f"{key}: must be an object with day_usd and/or month_usd")
        unknown = set(entry) - {"day_usd", "month_usd"}
        if unknown:
            raise BudgetError(f"{key}: unknown field(s) {sorted(unknown)} (day_usd, month_usd)")
        values: dict[str, float | None] = {}
        for name in ("day_usd", "month_usd"):
            value = entry.get(name)
            if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0):
                raise BudgetError(f"{key}.{name}: must be a number >= 0 (US dollars) or null")
            values[name] = None if value is None else float(value)
        return cls(**values)


def check_key(key: Any) -> str:
    """A budget key: a tenant, `*`, or `model:<name>` (ValueError otherwise)."""
    if not isinstance(key, str) or not key:
        raise BudgetError("a budget key is a tenant name, '*' or 'model:<name>'")
    if key == ANY_TENANT or key.startswith(MODEL_PREFIX):
        return key
    clean = clean_tenant(key)
    if clean != key:
        raise BudgetError(
            f"tenant {key!r}: at most {MAX_TENANT_CHARS} characters of letters, digits and ._:@/- (as dlqapp keeps it)"
        )
    return key


@dataclass(frozen=True)
class BudgetTable:
    """Budgets by key (module doc)."""

    entries: Mapping[str, Budget]

    @classmethod
    def parse(cls, text: str) -> BudgetTable:
        text = text.strip()
        if not text:
            return cls({})
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise BudgetError(f"not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise BudgetError('must be a JSON object: tenant or "*" -> {"day_usd", "month_usd"}')
        return cls({check_key(key): Budget.parse(key, entry) for key, entry in raw.items()})

    def with_entries(self, overrides: Mapping[str, Budget]) -> BudgetTable:
        return BudgetTable({**self.entries, **overrides}) if overrides else self

    def for_tenant(self, tenant: str) -> Budget | None:
        return self.entries.get(tenant) or self.entries.get(ANY_TENANT)

    def for_model(self, model: str | None) -> Budget | None:
        if not model:
            return None
        return self.entries.get(MODEL_PREFIX + model) or self.entries.get(MODEL_PREFIX + ANY_TENANT)

    def tenants(self) -> list[str]:
        return sorted(k for k in self.entries if not k.startswith(MODEL_PREFIX) and k != ANY_TENANT)

    def models(self) -> list[str]:
        return sorted(k[len(MODEL_PREFIX) :] for k in self.entries if k.startswith(MODEL_PREFIX) and k != "model:*")

    def __bool__(self) -> bool:
        return bool(self.entries)


@dataclass(frozen=True, slots=True)
class Over:
    """Why a call may not start: `scope` (`tenant`/`model`) `name` would pass its `window` limit."""

    scope: str
    name: str
    window: str
    limit_nusd: int
    spent_nusd: int
    reserved_nusd: int
    estimate_nusd: int
    share: float = 1.0

    def reason(self) -> str:
        allowed = round(self.limit_nusd * self.share)
        where = "" if self.share >= 1 else f" (this worker's share, {self.share:.2f} of {usd(self.limit_nusd)})"
        return (
            f"{self.scope} {self.name} over its {self.window} budget: spent {usd(self.spent_nusd)}"
            f" + {usd(self.reserved_nusd)} in flight + {usd(self.estimate_nusd)} estimated > {usd(allowed)} USD{where}"
        )


def first_over(
    tenant: str,
    model: str | None,
    table: BudgetTable,
    *,
    now_ms: int,
    estimate_nusd: int,
    spent: Callable[[str], int],
    reserved: Callable[[str], int],
    share: float = 1.0,
) -> Over | None:
    """The first budget the call would pass (None: admitted). `spent(name)` reads a spend
    counter (`spend_name`) over the partitions this worker owns, `reserved(name)` the
    estimates it admitted and has not yet accounted under it; `share` is its share of the
    partitions (1: it alone)."""
    scopes = [("t", "tenant", tenant, table.for_tenant(tenant)), ("m", "model", model or "", table.for_model(model))]
    windows = window_names(now_ms)
    for scope, label, name, budget in scopes:
        if budget is None:
            continue
        for window in WINDOWS:
            limit = budget.limit_nusd(window)
            if limit is None:
                continue
            counter = spend_name(scope, name, windows[window])
            done, pending = spent(counter), reserved(counter)
            if done + pending + estimate_nusd > max(0.0, share) * limit:
                return Over(label, name, window, limit, done, pending, estimate_nusd, share)
    return None


def hold_until(now_ms: int, recheck_ms: int, deadline_ms: int | None) -> int:
    """When a held request is looked at again: the next re-check, the window's roll, or just
    past its deadline (then dead-lettered as `expired`), whichever comes first."""
    due = min(now_ms + recheck_ms, next_roll_ms(now_ms))
    if deadline_ms is not None:
        due = min(due, deadline_ms + 1)
    return max(due, now_ms + 1)
