"""`bench/run.py --quick`: the benchmark harness runs end to end and writes its reports.

Only the shape of the output is checked; the figures themselves belong to `make bench`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)  # a dozen workers one after another; slow on a busy machine
def test_quick_benchmark_writes_json_markdown_and_plots(kafka_bootstrap, tmp_path):
    out = tmp_path / "results"
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--out", str(out)],
        env={**os.environ, "KAFKA_BOOTSTRAP": kafka_bootstrap},
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((out / "latest.json").read_text())
    throughput = results["throughput"]
    for system in ("baseline_a_sync", "baseline_b_aiokafka", "dlqapp_0pct_failures", "dlqapp_10pct_failures"):
        assert throughput[system]["requests_per_s"] > 0
    assert throughput["ratio_dlqapp_to_a"] > 0 and throughput["ratio_dlqapp_to_b"] > 0
    lateness = results["lateness"]
    assert {"idle", "paced_under_flood", "burst", "under_flood"} <= set(lateness)
    assert lateness["paced_flood_to_idle_worst_tier_p99"] > 0 and lateness["flood_to_burst_worst_tier_p99"] > 0
    assert all(tier["n"] > 0 and tier["p99_ms"]["min"] >= 0 for tier in lateness["idle"].values())  # never early
    assert lateness["flood_to_idle_worst_tier_p99"] > 0 and "loop_lag_max_ms" in lateness["under_flood_runs"][0]
    assert results["timer"]["1000"]["tick_ratio_to_1k"] == 1.0
    scale = results["parked_scale"]
    for level in ("100", "1000"):
        assert scale[level]["parked"] == int(level)  # exact count from the worker, not the gauge used to wait
        assert scale[level]["rss_bytes"] > 0 and scale[level]["lateness_min_ms"] >= 0  # never early
    assert results["recovery"]["parked_after_restart"] == results["recovery"]["parked"]
    cost = results["stats_cost"]["1000"]
    assert cost["stats_p99_ms"]["median"] > 0 and cost["metrics_p99_ms"]["median"] > 0 and cost["rss_mib"]["median"] > 0
    for section, systems in (
        ("overhead", ("baseline_b_aiokafka", "baseline_c_faust", "dlqapp_0pct_failures", "dlqapp_10pct_failures")),
        (
            "llm_scale",
            ("baseline_b_aiokafka", "baseline_c_faust", "baseline_c_faust_dlqapp_http", "dlqapp_0pct_failures"),
        ),
    ):
        cost = results[section]
        for system in systems:
            assert len(cost[system]["runs"]) == 1
            assert cost[system]["requests_per_s"]["median"] > 0
            assert cost[system]["cpu_s_per_1k"]["median"] > 0
            # 100 requests cost the mock about one clock tick (10 ms): zero is a true reading here
            assert cost[system]["mock_cpu_s_per_1k"]["median"] >= 0
        assert cost["ratio_dlqapp_to_b"]["of_medians"] > 0 and len(cost["ratio_dlqapp_to_b"]["per_run"]) == 1
    assert results["overhead"]["ratio_10pct_to_0pct"]["of_medians"] > 0
    assert (
        results["overhead"]["ratio_dlqapp_to_c"]["of_medians"] > 0
        and results["overhead"]["ratio_c_to_b"]["of_medians"] > 0
    )
    assert results["llm_scale"]["ceiling_per_s"] == 512 and results["llm_scale"]["ratio_dlqapp_to_ceiling"] > 0
    assert set(results["llm_scale"]["cpu_dlqapp_to_c"]) == {"baseline_c_faust", "baseline_c_faust_dlqapp_http"}
    assert all(r["of_medians"] > 0 for r in results["llm_scale"]["cpu_dlqapp_to_c"].values())
    clients = results["http_client"]
    for client in ("aiohttp", "dlqapp"):
        assert len(clients[client]["runs"]) == 1 and clients[client]["cpu_us_per_call"]["median"] > 0
    assert clients["cpu_dlqapp_to_aiohttp"] > 0
    partitions = results["partitions"]
    assert set(partitions) == {"3", "12"} and all(
        p["rss_mib"]["median"] > 0 and p["start_to_ready_s"]["median"] > 0 for p in partitions.values()
    )
    rss = results["llm_scale"]["rss"]
    for system in ("baseline_b_aiokafka", "dlqapp"):
        assert rss[system]["rss_mib"] >= rss[system]["idle_rss_mib"] > 0
    report = (out / "latest.md").read_text()
    assert "dlqapp / A" in report and "1,000 parked" in report
    assert "## overhead" in report and "## llm_scale" in report and "calls in flight" in report
    assert "## http_client" in report
    for plot in ("throughput.png", "per_request_cost.png", "lateness_cdf.png"):
        assert (out / plot).read_bytes()[:4] == b"\x89PNG"
