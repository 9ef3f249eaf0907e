"""Run a history, check it, and when it fails make it smaller: drop half its events, then a
quarter, … down to single ones, run the rest again, and keep it when it still breaks one
of the gravest rules the first run broke. Bounded by a time budget and a number of runs.

What fails is written to `build/histories/` (or HISTORY_OUT): the history as JSON (the
shortest failing one too), what was collected, and a command line that plays it again:

    HISTORY_REPLAY=build/histories/<name>.json scripts/test tests/history -k replay -s
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.history.check import Violation, check_all, gravest, rule_names
from tests.history.generate import History
from tests.history.run import HistoryRun, ProxiedKafka, save
from tests.support import ROOT

OUT = Path(os.environ.get("HISTORY_OUT") or ROOT / "build" / "histories")


@dataclass
class Outcome:
    history: History
    collected: dict[str, Any]
    violations: list[Violation]
    workdir: Path

    @property
    def failed(self) -> bool:
        return bool(self.violations)

    def summary(self) -> dict[str, Any]:
        """One line of a report (CHAOS_REPORT)."""
        return {
            "test": "history",
            "history": self.history.name,
            "seed": self.history.seed,
            "events": len(self.history.events),
            **self.history.counts(),
            "requests": len({p["id"] for p in self.collected["produced"] if p["valid"]}),
            "records": len(self.collected["produced"]),
            "outcomes": sum(1 for o in self.collected["outcomes"] if not o["tombstone"]),
            "faults_injected": [f["kind"] for f in self.collected["faults"]],
            "operator_actions": [f"{o['action']}/{o['via']}" for o in self.collected["operator"]],
            "started_ahead": sum(run.get("started_ahead", 0) for run in self.collected.get("worker_runs", [])),
            "violations": len(self.violations),
            "rules_broken": sorted(rule_names(self.violations)),
            "seconds": self.collected.get("timing", {}).get("total_s"),
            "settled": self.collected.get("timing", {}).get("settled"),
        }


def play(history: History, kafka: ProxiedKafka, workdir: Path) -> Outcome:
    """Run `history` in `workdir` and check it (what was collected is saved there too)."""
    collected = HistoryRun(history, kafka, workdir).run()
    violations = check_all(collected)
    collected["violations"] = [v.as_dict() for v in violations]
    save(collected, workdir / "collected.json")
    return Outcome(history, collected, violations, workdir)


@dataclass
class Shrunk:
    smallest: Outcome
    runs: int
    tried: list[str] = field(default_factory=list)


def candidates(history: History) -> list[set[int]]:
    """Sets of event indexes to try dropping, as delta debugging does: halves first, then
    quarters, eighths, … down to single events (a `leave` goes with its `join`)."""
    events = [i for i, e in enumerate(history.events) if e.kind != "leave"]
    sets: list[set[int]] = []
    size = max(1, len(events) // 2)
    while True:
        sets += [set(events[start : start + size]) for start in range(0, len(events), size)]
        if size == 1:
            return sets
        size //= 2


def shrink(
    failing: Outcome,
    rerun: Callable[[History, int], Outcome],
    budget_s: float,
    max_runs: int,
) -> Shrunk:
    """The smallest history found (within `budget_s` and `max_runs` reruns) that still
    breaks one of the gravest rules `failing` broke (check.gravest: a count that drifts
    does not steer shrinking away from a lost request)."""
    wanted = gravest(failing.violations)
    best = failing
    runs = 0
    tried: list[str] = []
    deadline = time.monotonic() + budget_s
    progress = True
    while progress:
        progress = False
        for drop in candidates(best.history):
            if runs >= max_runs or time.monotonic() > deadline:
                return Shrunk(best, runs, tried)
            smaller = best.history.without(drop)
            if not smaller.events or len(smaller.events) >= len(best.history.events):
                continue
            runs += 1
            outcome = rerun(smaller, runs)
            still = rule_names(outcome.violations) & wanted
            tried.append(f"dropped {sorted(drop)} -> {len(smaller.events)} events: {sorted(still) or 'passes'}")
            if still:
                best = outcome
                progress = True
                break
    return Shrunk(best, runs, tried)


def write_failure(first: Outcome, shrunk: Shrunk | None) -> str:
    """Save the failing history (and its shortest form), print-ready text naming the files
    and the command that replays it."""
    OUT.mkdir(parents=True, exist_ok=True)
    stem = first.history.name.replace(" ", "_").replace("(", "").replace(")", "")
    original = OUT / f"{stem}.json"
    original.write_text(first.history.to_json())
    lines = [
        f"history {first.history.name!r} (seed {first.history.seed}) broke {len(rule_names(first.violations))}"
        f" rule(s), {len(first.violations)} violation(s):",
        *(f"  {v}" for v in first.violations[:30]),
        f"collected: {keep(first.workdir, OUT / stem)} (and the workers' logs)",
        f"history:   {original}",
    ]
    replay = original
    if shrunk is not None and shrunk.smallest is not first:
        small = OUT / f"{stem}.shrunk.json"
        small.write_text(shrunk.smallest.history.to_json())
        replay = small
        still = sorted(gravest(first.violations) & rule_names(shrunk.smallest.violations))
        lines += [
            f"shrunk in {shrunk.runs} rerun(s) to {len(shrunk.smallest.history.events)} of "
            f"{len(first.history.events)} events, still breaking {still}"
            f" (all it breaks: {sorted(rule_names(shrunk.smallest.violations))}):",
            shrunk.smallest.history.describe(),
            f"shortest:  {small} (collected: {keep(shrunk.smallest.workdir, OUT / (stem + '.shrunk'))})",
        ]
    elif shrunk is not None:
        lines.append(f"no smaller failing history found in {shrunk.runs} rerun(s)")
    else:
        lines.append(first.history.describe())
    try:
        shown = replay.relative_to(ROOT)
    except ValueError:
        shown = replay
    lines.append(f"replay:    HISTORY_REPLAY={shown} scripts/test tests/history -k replay -s")
    return "\n".join(lines)


def keep(workdir: Path, where: Path) -> Path:
    """Copy what a run collected and its logs out of the test's tmp dir (pytest keeps only
    its last few), to `where`; the copy of collected.json."""
    where.mkdir(parents=True, exist_ok=True)
    for path in [workdir / "collected.json", *workdir.glob("*.log")]:
        if path.exists():
            shutil.copy(path, where / path.name)
    return where / "collected.json"


def report_line(outcome: Outcome, extra: dict[str, Any] | None = None) -> str:
    """Print one JSON line for the history, and append it to CHAOS_REPORT when set."""
    line = json.dumps({**outcome.summary(), **(extra or {})}, default=str)
    print(line)
    if os.environ.get("CHAOS_REPORT"):
        with open(os.environ["CHAOS_REPORT"], "a") as f:
            f.write(line + "\n")
    return line
