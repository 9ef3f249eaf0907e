"""`DLQ_RATE_LIMITS`: requests and tokens per minute, per model (pure).

    gpt-4o-mini=5000rpm/2000000tpm,gpt-4o=500rpm/30000tpm,*=1000rpm

Each entry is `MODEL=LIMIT[/LIMIT]` with LIMIT `<n>rpm` or `<n>tpm`; `*` applies to every
model not named. A model with no entry (and no `*`) is not rate limited.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ANY_MODEL = "*"
_LIMIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(rpm|tpm)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class ModelLimit:
    """Per-minute limits of one model; None: not limited on that axis."""

    rpm: float | None = None
    tpm: float | None = None


@dataclass(frozen=True)
class RateLimits:
    """Limits by model name, with an optional `*` default."""

    by_model: dict[str, ModelLimit]

    def for_model(self, model: str) -> ModelLimit | None:
        """The limits that apply to `model`, or None when it is not limited."""
        return self.by_model.get(model) or self.by_model.get(ANY_MODEL)

    def __bool__(self) -> bool:
        return bool(self.by_model)


def parse_rate_limits(text: str) -> RateLimits:
    """Parse `DLQ_RATE_LIMITS`; raises ValueError saying what is wrong."""
    by_model: dict[str, ModelLimit] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        model, sep, spec = entry.rpartition("=")
        model = model.strip()
        if not sep or not model:
            raise ValueError(f"{entry!r} should be MODEL=<n>rpm[/<n>tpm] (example: gpt-4o=500rpm/30000tpm, *=1000rpm)")
        if model in by_model:
            raise ValueError(f"model {model!r} is named twice")
        by_model[model] = _parse_spec(model, spec)
    return RateLimits(by_model)


def _parse_spec(model: str, spec: str) -> ModelLimit:
    values: dict[str, float] = {}
    for part in spec.split("/"):
        match = _LIMIT.match(part)
        if not match:
            raise ValueError(f"{model}: {part.strip()!r} is not a limit (examples: 500rpm, 30000tpm)")
        amount, unit = float(match.group(1)), match.group(2).lower()
        if amount <= 0:
            raise ValueError(f"{model}: {unit} must be positive")
        if unit in values:
            raise ValueError(f"{model}: {unit} given twice")
        values[unit] = amount
    return ModelLimit(rpm=values.get("rpm"), tpm=values.get("tpm"))
