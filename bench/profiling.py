"""`--profile`: py-spy recording a system while it is measured, and a summary of where its time went."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path


class Profiler:
    """py-spy recording one process: a flame graph (`<name>.svg`) and its folded stacks
    (`<name>.folded`, read by `profile_summary` into `<name>.md`)."""

    def __init__(self, out: Path, name: str, pid: int) -> None:
        py_spy = Path(sys.executable).parent / "py-spy"
        if not py_spy.exists():
            raise SystemExit("--profile needs py-spy in the venv: .venv/bin/python -m pip install py-spy")
        out.mkdir(parents=True, exist_ok=True)
        self.out, self.name = out, name
        self.processes = [
            subprocess.Popen(
                [
                    str(py_spy),
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    "100",
                    "--nonblocking",
                    "--format",
                    fmt,
                    "--output",
                    str(out / f"{name}{suffix}"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for fmt, suffix in (("flamegraph", ".svg"), ("raw", ".folded"))
        ]

    def stop(self) -> None:
        """Stop recording; write the summary of the folded stacks beside them."""
        for process in self.processes:
            process.send_signal(signal.SIGINT)
        for process in self.processes:
            process.wait(timeout=120)
        folded = self.out / f"{self.name}.folded"
        if folded.exists():
            (self.out / f"{self.name}.md").write_text(profile_summary(folded.read_text(), self.name))


def _sample_counts(folded: str) -> tuple[dict[str, int], dict[str, int], int]:
    """Samples per function from folded stacks: inclusive (on the stack), self (on top), and all."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]  # per function, not per line
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
        own[frames[-1]] = own.get(frames[-1], 0) + n
    return inclusive, own, total


def profile_summary(folded: str, title: str, top: int = 30) -> str:
    """The functions with the largest share of samples: inclusive (on the stack) and self (on top)."""
    inclusive, own, total = _sample_counts(folded)
    lines = [
        f"# py-spy profile: {title}",
        "",
        f"{total:,} samples.",
        "",
        "| Inclusive % | Self % | Function |",
        "|---|---|---|",
    ]
    for frame, n in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"| {100 * n / total:.1f} | {100 * own.get(frame, 0) / total:.1f} | `{frame}` |")
    lines += ["", "| Self % | Function |", "|---|---|"]
    for frame, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"| {100 * n / total:.1f} | `{frame}` |")
    return "\n".join(lines) + "\n"
