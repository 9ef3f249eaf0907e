"""Sections measured by a module of their own: the README demo (bench/demo.py), TLS cost
(bench/tls_cost.py) and the soak (bench/soak.py)."""

from __future__ import annotations

import os
from typing import Any

from bench.demo import run_demo
from bench.soak import SoakConfig, run_soak
from bench.systems import Bench
from bench.tls_cost import run_tls_cost

SOAK_S = int(os.environ.get("SOAK_S", "1800"))
"""Length of the `soak` run (30 min by default)."""


def demo(bench: Bench) -> dict[str, Any]:
    """The README demo on fresh topics, measured (bench/demo.py)."""
    return run_demo(bench.bootstrap, bench.tmp, runs=1 if bench.quick else 3)


def tls_cost(bench: Bench) -> dict[str, Any]:
    """dlqapp on plaintext beside SASL_SSL under the overhead and llm_scale loads (bench/tls_cost.py)."""
    return run_tls_cost(
        bench.bootstrap,
        bench.tmp,
        runs=1 if bench.quick else (bench.runs or 3),
        requests=100 if bench.quick else bench.requests,
    )


def soak(bench: Bench) -> dict[str, Any]:
    """Steady state under a flaky provider with one outage (bench/soak.py); SOAK_S sets its length."""
    return run_soak(
        bench.bootstrap,
        bench.tmp,
        SoakConfig(duration_s=SOAK_S if not bench.quick else 60, outage_s=20 if not bench.quick else 5),
    )
