"""The value parsers of dlqapp's settings: each raises ValueError with what it expected."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import field
from typing import Any

from dlqapp.core.budgets import clean_tenant
from dlqapp.core.errors import ErrorClass

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, None: 1000}


def setting(env: str, default: str, parse: Callable[[str], Any], doc: str) -> Any:
    """A settings field: its environment variable, default (as text), parser and meaning."""
    return field(metadata={"env": env, "default": default, "parse": parse, "doc": doc})


def parse_duration_ms(text: str) -> int:
    """Parse `250ms`, `1s`, `10s`, `1m`, `2h`, `1d` or bare seconds (`1.5`) into ms."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration (examples: 250ms, 1s, 1m, 2h)")
    return round(float(match.group(1)) * _UNIT_MS[match.group(2)])


def format_duration(ms: int) -> str:
    """The shortest exact spelling of a duration: 1000 → `1s`, 60000 → `1m`."""
    for unit in ("d", "h", "m", "s"):
        size = _UNIT_MS[unit]
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{text!r} is not a boolean (use true or false)")


def _parse_delays(text: str) -> tuple[int, ...]:
    delays = tuple(parse_duration_ms(part) for part in text.split(",") if part.strip())
    if not delays:
        raise ValueError("at least one retry delay is needed (example: 1s,10s,1m)")
    if any(d <= 0 for d in delays):
        raise ValueError("retry delays must be positive")
    return delays


def _parse_retryable(text: str) -> dict[ErrorClass, bool]:
    """`context_length=true,unknown=false` → overrides of the default retryable table."""
    overrides: dict[ErrorClass, bool] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"{part!r} should be CLASS=true|false")
        try:
            error_class = ErrorClass(name.strip())
        except ValueError:
            known = ", ".join(c.value for c in ErrorClass)
            raise ValueError(f"unknown error class {name.strip()!r} (known: {known})") from None
        overrides[error_class] = _parse_bool(value)
    return overrides


def _parse_rate(text: str) -> float:
    rate = float(text)
    if not 0.0 <= rate <= 1.0:
        raise ValueError("must be between 0 and 1")
    return rate


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be 0 or a positive integer")
    return value


def _positive_duration(text: str) -> int:
    value = parse_duration_ms(text)
    if value < 1:
        raise ValueError("must be a positive duration (examples: 500ms, 10s)")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 < value < 65536:
        raise ValueError("must be a TCP port (1-65535)")
    return value


def _upper_choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().upper()
        if value not in options:
            raise ValueError(f"{text!r} is not one of: {', '.join(o for o in options if o)}")
        return value

    return parse


def _choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in options:
            raise ValueError(f"{text!r} is not one of: {', '.join(options)}")
        return text

    return parse


MIN_TOKEN_CHARS = 16


def _admin_token(text: str) -> str:
    token = text.strip()
    if token and len(token) < MIN_TOKEN_CHARS:
        raise ValueError(
            f"is {len(token)} characters; use at least {MIN_TOKEN_CHARS} (e.g. `openssl rand -hex 16`), "
            "or leave it empty for loopback-only mutations"
        )
    return token


def _name_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip().rstrip("/").lower() for part in text.split(",") if part.strip())


def _optional_int(text: str) -> int | None:
    return int(text) if text.strip() else None


def _parse_weights(text: str) -> dict[str, float]:
    """DLQ_TENANT_WEIGHTS: a JSON object of tenant -> positive number."""
    if not text.strip():
        return {}
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError("must be a JSON object: tenant -> weight")
    weights = {}
    for tenant, weight in raw.items():
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight <= 0:
            raise ValueError(f"{tenant}: a weight is a number > 0")
        weights[_tenant_name(tenant)] = float(weight)
    return weights


def _tenant_name(text: str) -> str:
    name = clean_tenant(text)
    if name is None or name != text:
        raise ValueError("a tenant name is 1-64 characters of letters, digits and ._:@/-")
    return name
