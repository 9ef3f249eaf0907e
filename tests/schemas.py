"""The JSON Schemas dlqapp ships (dlqapp/schemas/), for tests that check real messages against them."""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator

SCHEMAS = ("input", "result", "dead-letter")

KEY_FORMS = {
    "request": re.compile(
        r"^(?!invalid-[0-9a-f]{32}$)(?!poison-[0-9a-f]{12}$)(?!.*~(?:invalid_request|poison)~).+$", re.S
    ),
    "unprocessable copy": re.compile(r"^.+~(?:invalid_request|poison)~[0-9a-f]{12}$", re.S),
    "invalid without id": re.compile(r"^invalid-[0-9a-f]{32}$"),
    "poison without id": re.compile(r"^poison-[0-9a-f]{12}$"),
}
"""The dead-letter key forms, as docs/schemas.md and the dead-letter schema describe them."""


@cache
def schema(name: str) -> dict[str, Any]:
    """`input`, `result` or `dead-letter`, as installed with the package."""
    return json.loads((resources.files("dlqapp") / "schemas" / f"{name}.schema.json").read_text(encoding="utf-8"))


@cache
def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(schema(name))


def errors(name: str, doc: Any) -> list[str]:
    """Every way `doc` breaks the schema, as readable lines (empty when it validates)."""
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in validator(name).iter_errors(doc)]


def assert_valid(name: str, doc: Any, declared: bool = True) -> None:
    """`doc` validates against the schema; with `declared`, every top-level field it has is
    one the schema names (the schemas allow unknown fields for consumers' sake, so this is
    how a field dlqapp starts writing without documenting it is caught)."""
    problems = errors(name, doc)
    assert not problems, f"{name} schema: {problems} in {json.dumps(doc)[:500]}"
    if declared and isinstance(doc, dict):
        unknown = set(doc) - set(schema(name)["properties"])
        assert not unknown, f"fields missing from the {name} schema: {sorted(unknown)}"


def key_form(key: str) -> str:
    """Which documented form a dead letter's key has (AssertionError when none)."""
    forms = [form for form, pattern in KEY_FORMS.items() if pattern.match(key)]
    assert len(forms) == 1, f"dead-letter key {key!r} matches {forms or 'no documented form'}"
    return forms[0]
