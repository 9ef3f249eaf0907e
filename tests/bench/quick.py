"""Run `bench/run.py --quick` for some of its sections (each test file a share, so that the
suite's workers run them side by side) and read back what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

HANDLING = ("throughput", "overhead", "llm_scale", "http_client", "latency")
"""The sections of tests/bench/test_bench_quick_handling.py: requests through dlqapp and the baselines."""
RETRIES = ("lateness", "timer", "parked_scale", "recovery", "stats_cost", "partitions")
"""The sections of tests/bench/test_bench_quick_retries.py: retries, state and their cost."""


def run_quick(bootstrap: str, out: Path, sections: tuple[str, ...]) -> dict[str, Any]:
    """`bench/run.py --quick --only <sections>` into `out`; its latest.json."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--only", ",".join(sections), "--out", str(out)],
        env={**os.environ, "KAFKA_BOOTSTRAP": bootstrap},
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results: dict[str, Any] = json.loads((out / "latest.json").read_text())
    assert set(sections) <= set(results)
    return results


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:4] == b"\x89PNG", path
