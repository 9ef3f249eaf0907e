"""Prices per model and what an attempt cost (pure).

`DLQ_PRICES` is a JSON object, or the path of a file holding one:
`{"gpt-4o-mini": {"input": 0.15, "cached_input": 0.075, "output": 0.6}, "*": {...}}`, in US
dollars per million tokens. `cached_input` defaults to `input`; `*` prices every model not
named. A model with no price (and no `*`) is counted in tokens only and flagged `unpriced`.

Money is kept in whole nano-dollars (1e-9 USD, `nusd`): sums of integers are exact, and a
64-bit count holds over nine billion dollars. The API shows dollars (`usd`).

cost = (prompt - cached) * input + cached * cached_input + completion * output (per 1e6 tokens);
reasoning tokens are part of `completion` and billed as output.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dlqapp.core import compact_json
from dlqapp.core.usage import Usage

NANO = 1_000_000_000
"""nano-dollars in a dollar."""
ANY_MODEL = "*"


class PriceError(ValueError):
    """DLQ_PRICES is not a valid price table."""


@dataclass(frozen=True, slots=True)
class Price:
    """US dollars per million tokens."""

    input: float
    cached_input: float
    output: float

    def cost_nusd(self, usage: Usage) -> int:
        """What `usage` costs, in nano-dollars (rounded to the nearest)."""
        uncached = max(0, usage.prompt - usage.cached)
        # per million tokens -> nano-dollars per token: x 1e9 / 1e6 = x 1000
        return round(
            uncached * self.input * 1000
            + usage.cached * self.cached_input * 1000
            + usage.completion * self.output * 1000
        )


@dataclass(frozen=True)
class PriceTable:
    """Prices by model; `*` for any model not named."""

    prices: Mapping[str, Price]

    @classmethod
    def parse(cls, text: str) -> PriceTable:
        """A table from JSON text, or from the file `text` names; empty text: no prices."""
        text = text.strip()
        if not text:
            return cls({})
        if not text.startswith("{"):
            try:
                with open(text, encoding="utf-8") as handle:
                    text = handle.read()
            except OSError as exc:
                raise PriceError(f"not a JSON object, nor a readable file: {exc}") from None
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise PriceError(f"not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise PriceError("must be a JSON object: model -> {input, cached_input, output}")
        return cls({str(model): _price(model, entry) for model, entry in raw.items()})

    def price_of(self, model: str | None) -> Price | None:
        if model is not None and model in self.prices:
            return self.prices[model]
        return self.prices.get(ANY_MODEL)

    def cost_nusd(self, model: str | None, usage: Usage) -> int | None:
        """What `usage` on `model` cost (nano-dollars), None when the model has no price."""
        price = self.price_of(model)
        return None if price is None else price.cost_nusd(usage)

    def as_dict(self) -> dict[str, dict[str, float]]:
        return {
            m: {"input": p.input, "cached_input": p.cached_input, "output": p.output} for m, p in self.prices.items()
        }

    def __bool__(self) -> bool:
        return bool(self.prices)


def _price(model: Any, entry: Any) -> Price:
    if not isinstance(entry, dict):
        raise PriceError(f"{model}: must be an object with input, cached_input and output")
    unknown = set(entry) - {"input", "cached_input", "output"}
    if unknown:
        raise PriceError(f"{model}: unknown field(s) {sorted(unknown)} (input, cached_input, output)")
    values = {}
    for name in ("input", "output", "cached_input"):
        value = entry.get(name, entry.get("input") if name == "cached_input" else None)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise PriceError(f"{model}.{name}: must be a number >= 0 (USD per million tokens)")
        values[name] = float(value)
    return Price(**values)


def usd(nusd: int) -> float:
    """Nano-dollars as dollars, for display (9 decimals kept)."""
    return round(nusd / NANO, 9)


def nusd_of(value: float) -> int:
    """Dollars as nano-dollars."""
    return round(value * NANO)


def read_prices_setting(value: str) -> PriceTable:
    """DLQ_PRICES: JSON, or a path (a leading `@` is accepted, as in `@/etc/prices.json`)."""
    value = value.strip()
    if value.startswith("@"):
        value = value[1:]
    if value and not value.startswith("{") and not os.path.exists(value):
        raise PriceError(f"not a JSON object, nor an existing file: {value!r}")
    return PriceTable.parse(value)


@dataclass(frozen=True, slots=True)
class Spent:
    """What a request's attempts used and cost so far (carried in its `spent` header)."""

    usage: Usage = field(default_factory=Usage)
    nusd: int = 0
    unpriced: bool = False
    """Some attempt ran on a model without a price: `nusd` leaves it out."""

    def plus(self, usage: Usage, nusd: int | None) -> Spent:
        return Spent(self.usage + usage, self.nusd + (nusd or 0), self.unpriced or nusd is None)

    @property
    def cost_usd(self) -> float:
        return usd(self.nusd)

    def encode(self) -> str:
        u = self.usage
        doc: dict[str, Any] = {"p": u.prompt, "c": u.completion, "k": u.cached, "r": u.reasoning, "n": self.nusd}
        if u.estimated:
            doc["e"] = 1
        if self.unpriced:
            doc["u"] = 1
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | None) -> Spent:
        """The header's value; nothing spent when absent or malformed (never raises)."""
        try:
            doc = compact_json.loads(text) if text else None
        except (ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict):
            return cls()

        def count(name: str) -> int:
            value = doc.get(name)
            return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

        usage = Usage(count("p"), count("c"), count("k"), count("r"), bool(doc.get("e")))
        return cls(usage, count("n"), bool(doc.get("u")))

    def public(self) -> dict[str, Any]:
        """The fields results and dead letters show: `tokens`, `cost_usd`, and flags when set."""
        doc: dict[str, Any] = {"tokens": self.usage.tokens(), "cost_usd": self.cost_usd}
        if self.usage.estimated:
            doc["cost_estimated"] = True
        if self.unpriced:
            doc["unpriced"] = True
        return doc
