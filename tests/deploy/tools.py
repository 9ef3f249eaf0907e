"""The command-line tools the deploy tests run (promtool, kustomize): found on PATH or in
.venv/bin, where `scripts/deploy-tools` installs them. Without them a test skips on a
developer's machine and fails under CI (CI=true), so a CI run never passes by skipping."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def tool(name: str) -> str:
    """The path of `name`, or skip (fail under CI) naming how to install it."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found:
        return found
    message = f"{name} not found: run scripts/deploy-tools (CI runs it from .ci/run)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run a tool; fail with its output when it exits non-zero."""
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result
