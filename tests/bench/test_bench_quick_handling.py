"""`bench/run.py --quick`, the sections that run requests through dlqapp and the baselines:
the harness runs end to end and writes its reports.

Only the shape of the output is checked; the figures themselves belong to `make bench`.
"""

from __future__ import annotations

import pytest

from tests.bench.quick import HANDLING, assert_png, run_quick


@pytest.mark.timeout(600)  # workers one after another; slow on a busy machine
def test_quick_handling_sections_write_json_markdown_and_plots(kafka_bootstrap, tmp_path):
    out = tmp_path / "results"
    results = run_quick(kafka_bootstrap, out, HANDLING)
    throughput = results["throughput"]
    for system in ("baseline_a_sync", "baseline_b_aiokafka", "dlqapp_0pct_failures", "dlqapp_10pct_failures"):
        assert throughput[system]["requests_per_s"] > 0
    assert throughput["ratio_dlqapp_to_a"] > 0 and throughput["ratio_dlqapp_to_b"] > 0
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
    rss = results["llm_scale"]["rss"]
    for system in ("baseline_b_aiokafka", "dlqapp"):
        assert rss[system]["rss_mib"] >= rss[system]["idle_rss_mib"] > 0
    report = (out / "latest.md").read_text()
    assert "dlqapp / A" in report
    assert "## overhead" in report and "## llm_scale" in report and "calls in flight" in report
    assert "## http_client" in report
    for plot in ("throughput.png", "per_request_cost.png"):
        assert_png(out / plot)
