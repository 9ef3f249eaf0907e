"""`bench/run.py --quick`, the sections on retries, state and their cost: the harness runs
end to end and writes its reports.

Only the shape of the output is checked; the figures themselves belong to `make bench`.
"""

from __future__ import annotations

import pytest

from tests.bench.quick import HANDLING, RETRIES, assert_png, run_quick


def test_the_two_quick_files_run_every_section_of_a_quick_run_between_them():
    from bench.run import chosen_sections

    assert sorted(HANDLING + RETRIES) == sorted(chosen_sections("", quick=True))


@pytest.mark.timeout(600)  # workers one after another; slow on a busy machine
def test_quick_retry_sections_write_json_markdown_and_plots(kafka_bootstrap, tmp_path):
    out = tmp_path / "results"
    results = run_quick(kafka_bootstrap, out, RETRIES)
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
    partitions = results["partitions"]
    assert set(partitions) == {"3", "12"} and all(
        p["rss_mib"]["median"] > 0 and p["start_to_ready_s"]["median"] > 0 for p in partitions.values()
    )
    assert "1,000 parked" in (out / "latest.md").read_text()
    assert_png(out / "lateness_cdf.png")
