"""Importing dlqapp builds nothing; the composition root builds everything."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

IMPORT_ALL = """
import importlib, pkgutil, dlqapp
for module in pkgutil.walk_packages(dlqapp.__path__, "dlqapp."):
    importlib.import_module(module.name)
print("imported")
"""


def test_importing_every_module_reads_no_environment_and_creates_nothing(tmp_path):
    env = {
        **os.environ,
        "DLQ_PARTITIONS": "not-a-number",
        "DLQ_DATA_DIR": str(tmp_path / "data"),
        "PYTHONPATH": str(ROOT),
    }
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "imported" in result.stdout, result.stderr
    assert list(tmp_path.iterdir()) == []  # no data dir, no log


def test_the_app_is_built_on_first_access_and_names_a_bad_setting(tmp_path):
    env = {**os.environ, "DLQ_PARTITIONS": "not-a-number", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", "import dlqapp; dlqapp.app"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "DLQ_PARTITIONS" in result.stderr


def test_build_app_registers_every_agent_and_command(tmp_path):
    env = {**os.environ, "DLQ_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT)}
    agents = subprocess.run(
        [sys.executable, "-c", "import dlqapp; print(sorted(dlqapp.app.agents))"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert agents.returncode == 0, agents.stderr
    for name in ("input", "due", "dlq", "operator", "tier-1", "tier-2", "tier-3"):
        assert f".{name}'" in agents.stdout or f"'{name}'" in agents.stdout, agents.stdout
    usage = subprocess.run(
        [sys.executable, "-m", "dlqapp", "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    for command in (
        "dlq-list",
        "dlq-show",
        "dlq-reprocess",
        "dlq-discard",
        "dlq-stats",
        "request-status",
        "generate",
        "worker",
    ):
        assert command in usage.stdout, usage.stdout + usage.stderr


def test_the_consumer_fetch_wait_comes_from_dlq_fetch_max_wait(tmp_path):
    """Faust fixes aiokafka's fetch_max_wait_ms at 1500; dlqapp's consumer takes the setting."""
    probe = (
        "import asyncio, dlqapp\n"
        "async def main():\n"
        "    c = dlqapp.app.consumer; k = c._thread._create_worker_consumer(dlqapp.app.transport)\n"
        "    print(type(c).__name__, k._fetch_max_wait_ms)\n"
        "asyncio.run(main())"
    )
    for value, expected in ((None, "50"), ("200ms", "200")):
        env = {k: v for k, v in os.environ.items() if k != "DLQ_FETCH_MAX_WAIT"}
        env.update(
            {
                "DLQ_DATA_DIR": str(tmp_path / "data"),
                "PYTHONPATH": str(ROOT),
                **({"DLQ_FETCH_MAX_WAIT": value} if value else {}),
            }
        )
        result = subprocess.run(
            [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["OrderedConsumer", expected], result.stdout


def test_table_writes_do_not_stop_the_consumer_at_faust_s_100_message_buffer(tmp_path):
    env = {**os.environ, "DLQ_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT)}
    probe = "import dlqapp; print(dlqapp.app.producer.buffer.max_messages)"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 10_000
