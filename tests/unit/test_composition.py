"""Importing dlqapp builds nothing; the composition root builds everything."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

IMPORT_ALL = """
import importlib, pkgutil, dlqapp
for module in pkgutil.walk_packages(dlqapp.__path__, "dlqapp."):
    importlib.import_module(module.name)
print("imported")
"""


def test_importing_every_module_reads_no_environment_and_creates_nothing(tmp_path):
    env = {**os.environ, "DLQ_PARTITIONS": "not-a-number", "DLQ_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", IMPORT_ALL], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "imported" in result.stdout, result.stderr
    assert list(tmp_path.iterdir()) == []  # no data dir, no log


def test_the_app_is_built_on_first_access_and_names_a_bad_setting(tmp_path):
    env = {**os.environ, "DLQ_PARTITIONS": "not-a-number", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", "import dlqapp; dlqapp.app"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "DLQ_PARTITIONS" in result.stderr


def test_build_app_registers_every_agent_and_command(tmp_path):
    env = {**os.environ, "DLQ_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT)}
    agents = subprocess.run([sys.executable, "-c", "import dlqapp; print(sorted(dlqapp.app.agents))"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert agents.returncode == 0, agents.stderr
    for name in ("input", "due", "dlq", "operator", "tier-1", "tier-2", "tier-3"):
        assert f".{name}'" in agents.stdout or f"'{name}'" in agents.stdout, agents.stdout
    usage = subprocess.run([sys.executable, "-m", "dlqapp", "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    for command in ("dlq-list", "dlq-show", "dlq-reprocess", "dlq-discard", "dlq-stats", "request-status", "generate", "worker"):
        assert command in usage.stdout, usage.stdout + usage.stderr
