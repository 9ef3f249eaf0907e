"""The report of a run: latest.json, latest.md (a table per section) and the plots, plus a
JSON of its own for the demo, TLS cost, soak and trace cost sections."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.demo import markdown as demo_markdown
from bench.sections.lateness import LATENESS_SCENARIOS
from bench.sections.trace_cost import markdown as trace_cost_markdown
from bench.soak import markdown as soak_markdown
from bench.soak import plot as soak_plot
from bench.systems import CONCURRENCY, LATENCY_MS
from bench.tls_cost import markdown as tls_markdown

MODES = ("exactly_once", "at_least_once")
"""Processing guarantees a section may measure beside its default one (nested under the mode's name)."""
SYSTEMS = ("baseline_a_sync", "baseline_b_aiokafka", "dlqapp_0pct_failures", "dlqapp_10pct_failures")
"""`throughput`'s systems, in the order of its table and plot."""
FLOW_SETUPS = ("none", "adaptive_concurrency", "rate_limits")
"""`flow_control`'s setups, in the order of its table."""
COST_LABELS = {
    "baseline_b_aiokafka": ("B: aiokafka", "#555"),
    "baseline_c_faust": ("C: Faust floor", "#999"),
    "dlqapp_0pct_failures": ("dlqapp 0%", "#2f5bea"),
    "dlqapp_0pct_failures_at_least_once": ("dlqapp 0%, at_least_once", "#8fa8f0"),
    "dlqapp_10pct_failures": ("dlqapp 10%", "#7f9cf5"),
    "dlqapp_before": ("dlqapp 0%, BENCH_BEFORE tree", "#c0c8e0"),
}
"""Bar label and colour of each system in per_request_cost.png."""
COST_SYSTEMS = ("baseline_b_aiokafka", "baseline_c_faust", "dlqapp_0pct_failures")


def write_report(results: dict[str, Any], out: Path) -> None:
    """Write every file of the report into `out` (the lateness samples go to the plot only)."""
    out.mkdir(parents=True, exist_ok=True)
    samples = {}
    for section in ("lateness", "parked_scale"):
        figures = results.get(section, {})
        nested = [(mode, figures[mode]) for mode in MODES if isinstance(figures.get(mode), dict)]
        for prefix, held in [(figures.get("guarantee", ""), figures), *nested]:
            for key in [k for k in held if k.endswith("_samples")]:
                name = key.removesuffix("_samples") + (f" ({prefix})" if prefix else "")
                samples[f"{section}/{name}"] = held.pop(key)
    (out / "latest.json").write_text(json.dumps(results, indent=2))
    (out / "latest.md").write_text(markdown(results))
    plots(results, samples, out)
    for section in ("demo", "tls_cost", "soak", "trace_cost"):
        if section in results:
            (out / f"{section}.json").write_text(
                json.dumps({"when": results["when"], "machine": results["machine"], **results[section]}, indent=2)
            )
    if "soak" in results:
        soak_plot(results["soak"], out)


# -- markdown --------------------------------------------------------------------------


def markdown(r: dict[str, Any]) -> str:
    """latest.md: a header, then the table of each section the run measured."""
    header = f"{r['when']} on {r['machine']}; backend latency {LATENCY_MS} ms, concurrency {CONCURRENCY}" + (
        " (quick)" if r["quick"] else ""
    )
    lines = ["# dlqapp benchmark", "", header, ""]
    for section, render in (
        ("throughput", _md_throughput),
        ("overhead", _md_overhead),
        ("llm_scale", _md_llm_scale),
        ("http_client", _md_http_client),
        ("latency", _md_latency),
        ("lateness", _md_lateness),
        ("timer", _md_timer),
        ("parked_scale", _md_parked_scale),
        ("recovery", _md_recovery),
        ("stats_cost", _md_stats_cost),
        ("flow_control", _md_flow_control),
        ("partitions", _md_partitions),
        ("scale_out", _md_scale_out),
        ("soak", soak_markdown),
        ("tls_cost", tls_markdown),
        ("demo", demo_markdown),
        ("guarantee", _md_guarantee),
        ("trace_cost", trace_cost_markdown),
    ):
        if section in r:
            lines += [*render(r[section]), ""]
    return "\n".join(lines)


def _md_throughput(t: dict[str, Any]) -> list[str]:
    lines = ["| System | Requests/s (median) | Requests/s per run |", "|---|---|---|"]
    for name in SYSTEMS:
        lines.append(f"| {name} | {t[name]['requests_per_s']:.1f} | {', '.join(f'{x:.1f}' for x in t[name]['runs'])} |")
    return [
        *lines,
        "",
        f"dlqapp / A = **{t['ratio_dlqapp_to_a']:.1f}×**, dlqapp / B = **{t['ratio_dlqapp_to_b']:.2f}×** (10% "
        f"failures: {t['ratio_dlqapp_10pct_to_b']:.2f}× of B)",
    ]


def _cell(figure: dict[str, float], digits: int = 1) -> str:
    """Median (min–max) of one figure over runs."""
    return f"{figure['median']:.{digits}f} ({figure['min']:.{digits}f}–{figure['max']:.{digits}f})"


def _md_cost_rows(section: dict[str, Any], systems: tuple[str, ...]) -> list[str]:
    lines = [
        "| System | Requests/s median (min–max) | Requests/s per run | CPU s per 1k requests | mock LLM CPU s per 1k |",
        "|---|---|---|---|---|",
    ]
    for name in systems:
        v = section[name]
        runs = ", ".join(f"{row['requests_per_s']:.1f}" for row in v["runs"])
        lines.append(
            f"| {name} | {_cell(v['requests_per_s'])} | {runs} | {_cell(v['cpu_s_per_1k'], 2)} | "
            f"{_cell(v['mock_cpu_s_per_1k'], 2)} |"
        )
    return lines


def _md_guarantee(g: dict[str, Any]) -> list[str]:
    lines = ["## guarantee: at_least_once beside exactly_once, in turn in every run", ""]
    for key, title in (
        ("latency_0ms", "mock at 0 ms, 64 in flight"),
        ("latency_100ms", "mock at 100 ms, 64 in flight"),
        ("llm_scale", "mock at 2000 ± 500 ms, 1,024 in flight"),
    ):
        section = g[key]
        lines += [
            f"### {title}, {section['requests']:,} requests per run",
            "",
            *_md_cost_rows(section, ("at_least_once", "exactly_once")),
            "",
        ]
        lines.append(f"exactly_once / at_least_once = {_md_ratio(section['ratio_exactly_once_to_at_least_once'])}")
        lines.append("")
    lines.append(
        f"exactly_once at the LLM scale / ceiling ({g['llm_scale']['ceiling_per_s']:.0f}/s) = "
        f"**{g['llm_scale']['exactly_once_to_ceiling']:.2f}×**"
    )
    lines += ["", "| Guarantee | Rate | e2e p50 ms | e2e p99 ms |", "|---|---|---|---|"]
    for mode, figures in g["paced"].items():
        lines.append(f"| {mode} | {figures['rate_per_s']}/s | {figures['e2e_p50_ms']} | {figures['e2e_p99_ms']} |")
    return lines


def _md_ratio(ratio: dict[str, Any]) -> str:
    return f"**{ratio['of_medians']:.2f}×** (per run: {', '.join(f'{x:.2f}' for x in ratio['per_run'])})"


def _md_overhead(o: dict[str, Any]) -> list[str]:
    mode, other = o.get("guarantee", "at_least_once"), o.get("other_guarantee")
    lines = [
        f"## overhead: mock LLM at 0 ms, {o['concurrency']} in flight, {o['requests']:,} requests per run; "
        f"dlqapp {mode}" + (f", and {other} beside it" if other else ""),
        "",
    ]
    lines += _md_cost_rows(
        o,
        tuple(
            n
            for n in (*COST_SYSTEMS, f"dlqapp_0pct_failures_{other}", "dlqapp_10pct_failures", "dlqapp_before")
            if n in o
        ),
    )
    beside = f"; dlqapp {other} / C = {_md_ratio(o['ratio_other_mode_to_c'])}" if "ratio_other_mode_to_c" in o else ""
    return [
        *lines,
        "",
        f"dlqapp / B = {_md_ratio(o['ratio_dlqapp_to_b'])}; dlqapp / C (Faust's floor) = "
        f"{_md_ratio(o['ratio_dlqapp_to_c'])}{beside}; C / B = {_md_ratio(o['ratio_c_to_b'])}; "
        f"dlqapp with 10% transient failures / dlqapp at 0% = {_md_ratio(o['ratio_10pct_to_0pct'])}",
        *_md_before(o),
    ]


def _md_before(s: dict[str, Any]) -> list[str]:
    """Today's worker against the BENCH_BEFORE tree's, when it ran beside."""
    if "ratio_now_to_before" not in s:
        return []
    return [
        "",
        f"dlqapp now / dlqapp of {s['before_tree']} (BENCH_BEFORE): requests/s {_md_ratio(s['ratio_now_to_before'])}; "
        f"CPU per request **{s['cpu_now_to_before']:.2f}×**",
    ]


def _md_llm_scale(s: dict[str, Any]) -> list[str]:
    lines = [
        f"## llm_scale: mock LLM at {s['latency_ms']} ± {s['jitter_ms']} ms, {s['concurrency']} in flight (ceiling "
        f"{s['ceiling_per_s']:.0f}/s), {s['requests']:,} requests per run; dlqapp "
        f"{s.get('guarantee', 'at_least_once')}"
        + (f", and {s['other_guarantee']} beside it" if "other_guarantee" in s else ""),
        "",
    ]
    other = f"dlqapp_0pct_failures_{s.get('other_guarantee')}"
    lines += _md_cost_rows(
        s,
        tuple(
            n
            for n in (
                "baseline_b_aiokafka",
                "baseline_c_faust",
                "baseline_c_faust_dlqapp_http",
                "dlqapp_0pct_failures",
                other,
                "dlqapp_before",
            )
            if n in s
        ),
    )
    lines += [
        "",
        f"dlqapp / B = {_md_ratio(s['ratio_dlqapp_to_b'])}; dlqapp / ceiling = "
        f"**{s['ratio_dlqapp_to_ceiling']:.2f}×**, B / ceiling = {s['ratio_b_to_ceiling']:.2f}×",
        *(
            f"dlqapp / {name}, CPU per request: {_md_ratio(ratio)}"
            for name, ratio in s.get("cpu_dlqapp_to_c", {}).items()
        ),
        *_md_before(s),
        "",
    ]
    rss = s.get("rss")
    if rss is None:
        return lines
    lines += [
        f"| Resident memory, {rss['in_flight']:,} calls in flight | idle MiB | in flight MiB | KiB per call |",
        "|---|---|---|---|",
    ]
    for name in ("baseline_b_aiokafka", "dlqapp"):
        v = rss[name]
        lines.append(f"| {name} | {v['idle_rss_mib']:.0f} | {v['rss_mib']:.0f} | {v['kib_per_call']:.1f} |")
    return lines


def _md_http_client(h: dict[str, Any]) -> list[str]:
    lines = [
        f"## http_client: the backend's HTTP client alone, mock LLM at {h['latency_ms']} ± {h['jitter_ms']} ms, "
        f"{h['in_flight']:,} in flight, {h['calls']:,} calls per run",
        "",
        "| Client | CPU µs per call | Calls/s |",
        "|---|---|---|",
    ]
    for name in ("aiohttp", "dlqapp"):
        v = h[name]
        lines.append(f"| {name} | {_cell(v['cpu_us_per_call'], 0)} | {_cell(v['calls_per_s'], 0)} |")
    return [*lines, "", f"dlqapp / aiohttp, CPU per call: **{h['cpu_dlqapp_to_aiohttp']:.2f}×**"]


def _md_latency(latency: dict[str, Any]) -> list[str]:
    lines = ["| Paced end-to-end | Rate | p50 ms | p99 ms |", "|---|---|---|---|"]
    return lines + [
        f"| {name} | {v['rate_per_s']}/s | {v['e2e_p50_ms']} | {v['e2e_p99_ms']} |" for name, v in latency.items()
    ]


def _md_lateness(lateness: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for figures in [lateness, *(lateness[m] for m in MODES if isinstance(lateness.get(m), dict))]:
        lines += _md_lateness_mode(figures)
    return lines


def _md_lateness_mode(lateness: dict[str, Any]) -> list[str]:
    cell = lambda s: f"{s['median']:.0f} ({s['min']:.0f}–{s['max']:.0f})"  # noqa: E731
    lines = [
        f"### Retry lateness, {lateness.get('guarantee', 'at_least_once')}",
        "",
        "Median of runs (min–max over runs); each run a fresh worker, the modes in turn.",
        "",
        "| Retry lateness | Tier | n | p50 ms | p99 ms | max ms | loop lag max ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in [s for s in LATENESS_SCENARIOS if s in lateness]:
        for tier, v in lateness[label].items():
            lines.append(
                f"| {label} | {tier} | {v['n']} | {cell(v['p50_ms'])} | {cell(v['p99_ms'])} | {v['max_ms']} | "
                f"{cell(lateness[label + '_loop_lag_max_ms'])} |"
            )
    worst = [
        f"{label} {cell(lateness[label + '_worst_tier_p99_ms'])} ms"
        for label in LATENESS_SCENARIOS
        if label + "_worst_tier_p99_ms" in lateness
    ]
    ratios = [
        f"{name} **{lateness[key]:.1f}×**"
        for key, name in (
            ("paced_flood_to_idle_worst_tier_p99", "paced flood / idle"),
            ("burst_to_idle_worst_tier_p99", "burst / idle"),
            ("flood_to_idle_worst_tier_p99", "burst flood / idle"),
            ("flood_to_burst_worst_tier_p99", "burst flood / burst"),
        )
        if key in lateness
    ]
    return [*lines, "", "Worst tier p99: " + ", ".join(worst) + ". At the median: " + ", ".join(ratios), ""]


def _md_timer(timer: dict[str, Any]) -> list[str]:
    churn = next(iter(timer.values()))["after_churn"]
    lines = [
        "| Timer tick (standalone scan) | Tick ms (median) | Ratio to 1k | Disk bytes/entry "
        f"| After {churn:,} fired: from first key ms | from kept start ms |",
        "|---|---|---|---|---|---|",
    ]
    return lines + [
        f"| {int(size):,} parked | {v['tick_ms_median']:.3f} | {v['tick_ratio_to_1k']:.2f} "
        f"| {v['disk_bytes_per_entry']:.0f} "
        f"| {v['tick_after_churn_from_first_key_ms']:.3f} | {v['tick_after_churn_from_kept_start_ms']:.3f} |"
        for size, v in timer.items()
    ]


def _md_parked_scale(scale: dict[str, Any]) -> list[str]:
    lines = [
        f"Worker RSS with nothing parked (after warm-up): {scale['empty_worker_rss_bytes'] / 2**20:.0f} MiB",
        "",
        "| Worker holding | Load s | RSS MiB | Peak RSS MiB | RSS bytes/parked | per parked since the previous level "
        "| Lateness p50 ms | p99 ms | max ms | p99 ratio to first |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level, v in scale.items():
        if isinstance(v, dict):
            lines.append(
                f"| {int(level):,} parked | {v['load_s']} | {v['rss_bytes'] / 2**20:.0f} "
                f"| {v['peak_rss_bytes'] / 2**20:.0f} | {v['rss_bytes_per_parked']:.0f} "
                f"| {v['rss_bytes_per_added_parked']:.0f} "
                f"| {v['lateness_p50_ms']} | {v['lateness_p99_ms']} | {v['lateness_max_ms']} "
                f"| {v['lateness_p99_ratio_to_first']:.2f} |"
            )
    return lines


def _md_recovery(rec: dict[str, Any]) -> list[str]:
    return [
        f"Recovery with {rec['parked']:,} parked retries: kill -9 → ready {rec['kill_to_ready_s']} s, → processing "
        f"{rec['kill_to_processing_s']} s; {rec['parked_after_restart']:,} parked after restart."
    ]


def _md_partitions(p: dict[str, Any]) -> list[str]:
    lines = [
        "| DLQ_PARTITIONS | start → ready, s | RSS idle, MiB | CPU idle, % | worst loop lag, ms |",
        "|---|---|---|---|---|",
    ]
    for count, f in p.items():
        lines.append(
            f"| {count} | {_cell(f['start_to_ready_s'])} | {_cell(f['rss_mib'], 0)} | {_cell(f['idle_cpu_pct'])} | "
            f"{_cell(f['loop_lag_ms'], 0)} |"
        )
    return lines


def _md_scale_out(o: dict[str, Any]) -> list[str]:
    lines = [
        f"Workers joining under {o['rate_per_s']} requests/s ({o['requests']:,} requests a run, "
        f"{o['partitions']} partitions, 1 s backend latency, 10% failing once; "
        f"median (min–max) of {o['runs']} runs): lost {o['lost']}.",
        "",
        "| Step | Results/s | Latency p50, s | Latency p99, s "
        "| Retry lateness p50, ms | Retry lateness p99, ms | Longest pause, s |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, f in o["steps"].items():
        lines.append(
            f"| {label} | {_cell(f['results_per_s'])} | {_cell(f['latency_p50_s'])} | {_cell(f['latency_p99_s'])} "
            f"| {_cell(f['retry_lateness_p50_ms'], 0)} "
            f"| {_cell(f['retry_lateness_p99_ms'], 0)} | {_cell(f['longest_pause_s'])} |"
        )
    return lines


def _md_stats_cost(cost: dict[str, Any]) -> list[str]:
    rows = [
        "## /dlq/stats/ and /metrics cost (median of runs, min–max)",
        "",
        "| request states in the table | start s (1st run restores) "
        "| stats p50 ms | stats p99 ms | metrics p50 ms | metrics p99 ms | RSS MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    cell = lambda s: f"{s['median']:.1f} ({s['min']:.1f}–{s['max']:.1f})"  # noqa: E731
    for row in cost.values():
        if isinstance(row, dict) and "requests" in row:
            rows.append(
                f"| {row['requests']:,} | {cell(row['start_s'])} | {cell(row['stats_p50_ms'])} | "
                f"{cell(row['stats_p99_ms'])} | {cell(row['metrics_p50_ms'])} | {cell(row['metrics_p99_ms'])} | "
                f"{cell(row['rss_mib'])} |"
            )
    ratio = cost["p99_ratio_large_to_small"]
    rows.append(
        f"\nstats p99 ratio, large to small, per run: median {ratio['median']:.2f}× "
        f"({ratio['min']:.2f}–{ratio['max']:.2f}×)"
    )
    return rows


def _md_flow_control(flow: dict[str, Any]) -> list[str]:
    rows = [
        f"## Flow control: {flow['requests']:,} requests, provider limited to {flow['provider_rpm']} rpm, "
        f"{flow['latency_ms']} ms latency",
        "",
        "| dlqapp | 429s sent | share of calls | attempts per request "
        "| succeeded | dead-lettered | completion s | outcomes/min |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in FLOW_SETUPS:
        if name in flow:
            v = flow[name]
            rows.append(
                f"| {name} | {v['429s']:,} | {v['429_share']:.1%} | {v['attempts_per_request']:.2f} | "
                f"{v['succeeded']:,} | {v['dead_lettered']:,} | {v['completion_s']} | {v['outcomes_per_min']} |"
            )
    return rows


# -- plots -----------------------------------------------------------------------------


def plots(r: dict[str, Any], samples: dict[str, list[float]], out: Path) -> None:
    """throughput.png, per_request_cost.png and lateness_cdf.png, for the sections the run measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "throughput" in r:
        _plot_throughput(plt, r["throughput"], out)
    loads = [(name, r[name]) for name in ("overhead", "llm_scale") if name in r]
    if loads:
        _plot_cost(plt, loads, out)
    if samples:
        _plot_lateness(plt, samples, out)


def _plot_throughput(plt: Any, throughput: dict[str, Any], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(
        ["A: sync", "B: aiokafka", "dlqapp 0%", "dlqapp 10%"],
        [throughput[n]["requests_per_s"] for n in SYSTEMS],
        color=["#999", "#555", "#2f5bea", "#7f9cf5"],
    )
    ax.set_ylabel("requests/s (median)")
    ax.set_title(f"Throughput at {LATENCY_MS} ms backend latency")
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)


def _plot_cost(plt: Any, loads: list[tuple[str, dict[str, Any]]], out: Path) -> None:
    fig, axes = plt.subplots(1, len(loads), figsize=(5 * len(loads), 4), squeeze=False)
    for ax, (name, section) in zip(axes[0], loads, strict=True):
        systems = [n for n in COST_LABELS if n in section]
        medians = [section[n]["requests_per_s"]["median"] for n in systems]
        errors = [
            [m - section[n]["requests_per_s"]["min"] for n, m in zip(systems, medians, strict=True)],
            [section[n]["requests_per_s"]["max"] - m for n, m in zip(systems, medians, strict=True)],
        ]
        ax.bar(
            [COST_LABELS[n][0] for n in systems],
            medians,
            yerr=errors,
            capsize=4,
            color=[COST_LABELS[n][1] for n in systems],
        )
        if "ceiling_per_s" in section:
            ax.axhline(
                section["ceiling_per_s"],
                color="#c33",
                linestyle="--",
                label=f"ceiling {section['ceiling_per_s']:.0f}/s",
            )
            ax.legend()
        ax.set_ylabel("requests/s (median, min–max)")
        jitter = f" ± {section['jitter_ms']}" if "jitter_ms" in section else ""
        ax.set_title(f"{name}: {section['latency_ms']}{jitter} ms, {section['concurrency']} in flight")
    fig.tight_layout()
    fig.savefig(out / "per_request_cost.png", dpi=110)
    plt.close(fig)


def _plot_lateness(plt: Any, samples: dict[str, list[float]], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 4))
    for label, values in samples.items():
        if values:
            ordered = sorted(values)
            ax.plot(
                ordered,
                [(i + 1) / len(ordered) for i in range(len(ordered))],
                label=label.replace("parked_scale/", "").replace("lateness/", ""),
            )
    ax.set_xlabel("lateness (ms): attempt time − scheduled_time")
    ax.set_ylabel("share of retries")
    ax.set_title("Retry lateness CDF: idle, a burst, under a flood, and with many retries parked")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "lateness_cdf.png", dpi=110)
    plt.close(fig)
