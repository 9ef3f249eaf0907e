"""Figures every benchmark section computes the same way: spreads, throughput, a process's CPU and memory."""

from __future__ import annotations

import os
import statistics
from typing import Protocol


class Stamped(Protocol):
    timestamp: int


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


STEADY_SHARE = 0.8


def throughput_of(records: list[Stamped]) -> float:
    """Results per second from the first result to the 80th percentile one.

    Startup is excluded, and so is the tail of requests still waiting out a retry delay
    (with 10% failures the last results arrive seconds later by design).
    """
    stamps = sorted(r.timestamp for r in records)
    last = max(1, int(len(stamps) * STEADY_SHARE) - 1)
    span = (stamps[last] - stamps[0]) / 1000
    return last / span if span > 0 else float("nan")


def spread(values: list[float]) -> dict[str, float]:
    """Median and range of one figure over several runs."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def process_memory(pid: int) -> dict[str, int]:
    """Resident memory of a process in bytes: now (VmRSS) and peak (VmHWM)."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(rest.split()[0]) * 1024
    return {"rss_bytes": fields["VmRSS"], "peak_rss_bytes": fields["VmHWM"]}


def load_average() -> float:
    """The machine's 1-minute load average (/proc/loadavg): how busy the shared machine was."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far, in seconds (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # fields 3… of stat(5); utime and stime are 14 and 15
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
