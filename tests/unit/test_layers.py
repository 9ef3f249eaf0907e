"""The folder listing is the architecture: packages in layers, imports only run downward.

A module may import its own package and any package in a lower layer; packages in one
layer do not import each other. No module imports one that (directly or not) imports it.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "dlqapp"

LAYERS: list[set[str]] = [
    {"core"},  # the domain: pure values and decisions
    {"flowcontrol"},  # rate, slots and gates over core values
    {"settings"},  # every setting, parsed and checked
    {"observability"},  # logs, metrics, health
    {"inference"},  # backends
    {"kafka"},  # adapters to Kafka and Faust's internals
    {"tables"},  # what a stream step writes on its partition, and how it stays durable
    {"deadletters"},  # the DLQ: entries, the recorder, operator actions
    {"retries"},  # parked retries, the timer, retry actions
    {"processing"},  # the request path
    {"maintenance"},  # offline operations on a stopped deployment
    {"api"},  # HTTP
    {"cli"},  # commands
    {"wiring"},  # the one composition root
]
TOOLS = {"devtools", "__init__", "__main__"}
"""Entry points and development tools: on top, imported by nothing in the app."""


def layer_of(package: str) -> int:
    if package in TOOLS:
        return len(LAYERS)
    return next(i for i, members in enumerate(LAYERS) if package in members)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def imports() -> dict[str, set[str]]:
    """dlqapp module → the dlqapp modules it imports (at any depth in the file).

    The root package is left out: it holds only `__version__` and the lazy `app` entry."""
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dlqapp."):
                for alias in node.names:  # `from dlqapp.cli import base` imports dlqapp.cli.base
                    sub = ROOT.parent / f"{node.module}.{alias.name}".replace(".", "/")
                    targets.add(
                        f"{node.module}.{alias.name}"
                        if sub.is_dir() or sub.with_suffix(".py").exists()
                        else node.module
                    )
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.startswith("dlqapp."))
        graph[module_name(path)] = targets
    return graph


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_package_has_a_layer() -> None:
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    packages |= {p.stem for p in ROOT.glob("*.py")}
    placed = set().union(*LAYERS) | TOOLS
    assert packages - placed == set(), "place the new package in LAYERS"


def test_imports_only_run_downward() -> None:
    upward = []
    for module, targets in imports().items():
        here = package_of(module)
        for target in targets:
            there = package_of(target)
            if there != here and layer_of(there) >= layer_of(here):
                upward.append(f"{module} imports {target}")
    assert sorted(upward) == []


def test_no_import_cycle() -> None:
    graph = {m: {t for t in ts if t in imports()} for m, ts in imports().items()}
    cycles = []
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycles.append(
                    " -> ".join([*path[path.index(target) :], module, target])
                    if target in path
                    else f"{module} -> {target}"
                )
            elif target not in state:
                visit(target, [*path, module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert cycles == []


MAX_MODULE_LINES = 350
"""A module longer than this is split by concern (docs/design.md, the code map)."""


def test_every_module_is_small() -> None:
    lengths = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in ROOT.rglob("*.py")}
    assert {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES} == {}
