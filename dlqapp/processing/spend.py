"""Money on the request path: each attempt's tokens and cost, and the budgets it must fit.

- `price` fills an attempt's history entry: the provider's usage (or the estimate of a
  failed call, dlqapp.core.usage), its model and its cost (DLQ_PRICES).
- `account` counts it, inside the attempt's stream step, on the request's partition:
  the tenant's and the model's spend in the day and month windows, token and cost totals
  (the running counts, dlqapp.tables.counters, committed with the step's outputs), and
  the Prometheus metrics by model, outcome, error class and tenant.
- `admit` decides, before a call, whether the tenant's and the model's budgets leave room
  for it: the spend of the partitions this worker owns + the estimates of the calls it
  admitted and has not yet accounted + this call's estimate, against its share of the budget
  (dlqapp.core.budgets.first_over). An admitted call holds a `Reservation` of its estimate
  until its step's writes are handed over (its real cost is in the counts by then); a call
  that does not fit is held (`Over`).

The bound: spend is counted per partition and each worker admits calls within its share of
the budget, so the workers together stay within it without seeing each other's calls; what
can pass it is a call costing more than its estimate and, during a rebalance, the revoked
partitions' calls still in flight on their old owner. The cluster-wide view
(dlqapp.tables.spend_view, every partition) is what `GET /budgets/` shows.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from dlqapp.core.backend import InferenceOutput
from dlqapp.core.budgets import (
    ANY_TENANT,
    MODEL_PREFIX,
    SPEND,
    WINDOWS,
    Budget,
    BudgetTable,
    Over,
    first_over,
    next_roll_ms,
    spend_name,
    spend_names,
    tenant_of,
    window_names,
)
from dlqapp.core.clock import Clock
from dlqapp.core.envelope import Attempt
from dlqapp.core.errors import Failure
from dlqapp.core.prices import PriceTable, usd
from dlqapp.core.requests import Request
from dlqapp.core.usage import attempt_usage, estimated_prompt_tokens
from dlqapp.flowcontrol.estimate import completion_budget
from dlqapp.observability import metrics
from dlqapp.tables.counters import Counters
from dlqapp.tables.spend_view import SpendView

VIEW_WAIT_S = 5.0
"""How long a call under a budget waits for the cluster's spend to be read at start before
its request is held instead (never admitted blind)."""


class Reservation:
    """An admitted call's estimated cost, counted against its budgets until accounted."""

    __slots__ = ("_names", "_nusd", "_pending")

    def __init__(self, pending: Counter[str] | None, names: list[str], nusd: int) -> None:
        self._pending = pending
        self._names = names
        self._nusd = nusd
        if pending is not None:
            for name in names:
                pending[name] += nusd

    def release(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            for name in self._names:
                pending[name] -= self._nusd
                if pending[name] <= 0:
                    del pending[name]


class Spending:
    """Prices, accounts and admits attempts (module doc)."""

    def __init__(
        self,
        prices: PriceTable,
        budgets: BudgetTable,
        *,
        view: SpendView,
        counters: Counters,
        default_model: str,
        default_tenant: str,
        clock: Clock,
        share: Callable[[], float] = lambda: 1.0,
        tenant_label: Callable[[str], str] = lambda tenant: tenant,
        model_label: Callable[[str], str] = lambda model: model,
    ) -> None:
        """`share()`: this worker's share of the work now (its input partitions / all);
        `tenant_label(tenant)`, `model_label(model)`: their labels on /metrics (metrics.BoundedLabel)."""
        self.prices = prices
        self.configured = budgets
        self.view = view
        self.counters = counters
        self.default_model = default_model
        self.default_tenant = default_tenant
        self.clock = clock
        self.share = share
        self.tenant_label = tenant_label
        self.model_label = model_label
        self.pending: Counter[str] = Counter()
        """Estimates of the calls this worker admitted and has not yet accounted, per spend counter."""

    def tenant_of(self, request: Request, headers: Mapping[str, str]) -> str:
        return tenant_of(request.metadata, headers, self.default_tenant)

    def budgets(self) -> BudgetTable:
        return self.view.budgets(self.configured)

    def model_of(self, request: Request, model: str | None = None) -> str:
        return model or request.model or self.default_model

    def estimate_nusd(self, request: Request, model: str) -> int:
        """The call's cost at most, as far as can be told before it: its prompt by the rule of
        thumb, uncached, and its whole completion budget."""
        price = self.prices.price_of(model)
        if price is None:
            return 0
        prompt, completion = estimated_prompt_tokens(request), completion_budget(request.params)
        return round(prompt * price.input * 1000 + completion * price.output * 1000)

    async def admit(self, request: Request, tenant: str, model: str) -> Reservation | Over | None:
        """A reservation when the call fits its budgets, `Over` when it does not; None when the
        spend of the cluster could not be read yet (hold it and look again)."""
        table = self.budgets()
        if table.for_tenant(tenant) is None and table.for_model(model) is None:
            return Reservation(None, [], 0)
        if not self.view.ready.is_set():
            try:
                await asyncio.wait_for(self.view.ready.wait(), VIEW_WAIT_S)
            except TimeoutError:
                return None
        now = self.clock()
        estimate = self.estimate_nusd(request, model)
        here, pending = self.view.spent_here, self.pending.__getitem__
        over = first_over(
            tenant, model, table, now_ms=now, estimate_nusd=estimate, spent=here, reserved=pending, share=self.share()
        )
        if over is not None:
            return over
        return Reservation(self.pending, spend_names(tenant, model, now), estimate)

    def price(
        self,
        attempt: Attempt,
        request: Request,
        output: InferenceOutput | None,
        failure: Failure | None,
        model: str | None = None,
    ) -> None:
        """Fill in the attempt's model, tokens and cost."""
        attempt.model = output.model if output is not None and output.model else self.model_of(request, model)
        attempt.usage = attempt_usage(
            request, output.usage if output is not None else None, failure.error_class if failure else None
        )
        attempt.cost_nusd = self.prices.cost_nusd(attempt.model, attempt.usage)

    def account(self, attempt: Attempt, tenant: str) -> None:
        """Count the attempt's tokens and cost (inside its stream step)."""
        usage = attempt.usage
        if usage is None:
            return
        model = attempt.model or self.default_model
        add = self.counters.add
        for kind, count in (("prompt", usage.prompt), ("completion", usage.completion), ("cached", usage.cached)):
            if count:
                add(f"tokens|{kind}", count)
        if usage.estimated:
            add("tokens_estimated", usage.prompt)
        outcome = "failed" if attempt.error_class else "succeeded"
        error_class = attempt.error_class or "none"
        label, model_label = self.tenant_label(tenant), self.model_label(model)
        labels = (model_label, outcome, error_class, label)
        for kind, count in (
            ("prompt", usage.prompt),
            ("completion", usage.completion),
            ("cached", usage.cached),
            ("reasoning", usage.reasoning),
        ):
            if count:
                metrics.tokens.labels(model_label, kind, outcome, error_class, label).inc(count)
        if attempt.cost_nusd is None:
            add("unpriced_attempts")
            metrics.unpriced_attempts.labels(model_label).inc()
            return
        if attempt.cost_nusd:
            add("cost_nusd", attempt.cost_nusd)
            for name in spend_names(tenant, model, attempt.at):
                add(name, attempt.cost_nusd)
            metrics.cost.labels(*labels).inc(usd(attempt.cost_nusd))

    def report(self, limit: int | None = None) -> dict[str, Any]:
        """`GET /budgets/`: per tenant (and per model with a budget), spent and left in the current
        UTC day and month, over the whole cluster, with the limits in force and where they come
        from; `limit`: only the tenants that spent the most this month (`tenants_total`: all)."""
        now = self.clock()
        windows = window_names(now)
        table = self.budgets()
        set_at_run_time = self.view.set_budgets()
        totals = self.view.totals()
        seen = {name.split("|")[2] for name in totals if name.startswith(f"{SPEND}|t|")}
        tenants = sorted(set(table.tenants()) | seen | {k for k in set_at_run_time if not k.startswith("model:")})
        tenants = [t for t in tenants if t != ANY_TENANT]
        tenants_total = len(tenants)
        if limit is not None:
            month = windows["month"]
            tenants = sorted(tenants, key=lambda t: -totals.get(spend_name("t", t, month), 0))[:limit]

        def entry(scope: str, name: str, budget: Budget | None, key: str) -> dict[str, Any]:
            row: dict[str, Any] = {}
            for window in WINDOWS:
                counter = spend_name(scope, name, windows[window])
                spent = totals.get(counter, 0)
                limit = budget.limit_nusd(window) if budget is not None else None
                row[window] = {
                    "window": windows[window],
                    "spent_usd": usd(spent),
                    "in_flight_usd": usd(self.pending[counter]),
                    "limit_usd": None if limit is None else usd(limit),
                    "left_usd": None if limit is None else usd(max(0, limit - spent)),
                }
            row["budget_from"] = (
                "run time" if key in set_at_run_time else "DLQ_BUDGETS" if key in table.entries else None
            )
            return row

        return {
            "now": now,
            "windows": windows,
            "resets_at": next_roll_ms(now),
            "ready": self.view.ready.is_set(),
            "default": table.entries[ANY_TENANT].as_dict() if ANY_TENANT in table.entries else None,
            "tenants": {
                t: entry("t", t, table.for_tenant(t), t if t in table.entries else ANY_TENANT) for t in tenants
            },
            "tenants_total": tenants_total,
            "models": {
                m: entry("m", m, table.for_model(m), MODEL_PREFIX + m)
                for m in sorted(
                    set(table.models())
                    | {k[len(MODEL_PREFIX) :] for k in set_at_run_time if k.startswith(MODEL_PREFIX)}
                )
                if m != ANY_TENANT
            },
            "set_at_run_time": set_at_run_time,
        }
