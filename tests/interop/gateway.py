"""A real LiteLLM proxy for the interop tests: installed once into its own virtualenv, run on loopback.

LiteLLM is pinned to the version these tests were written against: an upgrade is a
deliberate change of LITELLM_SPEC (or INTEROP_LITELLM_SPEC for one run).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import free_port, http_json, wait_until

LITELLM_SPEC = os.environ.get("INTEROP_LITELLM_SPEC", "litellm[proxy]==1.81.13")
CACHE = Path(os.environ.get("DLQAPP_INTEROP_CACHE", Path.home() / ".cache" / "dlqapp-interop"))
MASTER_KEY = "sk-dlqapp-interop"


class InstallError(RuntimeError):
    """LiteLLM could not be installed (the reason is the message)."""


def litellm_venv() -> Path:
    """The virtualenv holding LITELLM_SPEC, created with this Python on first use (cached)."""
    venv = CACHE / "litellm-venv"
    marker = venv / ".dlqapp-installed"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs must not install into one venv at once
        if marker.exists() and marker.read_text() == LITELLM_SPEC:
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(venv)], 300)
        _run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q", LITELLM_SPEC],
            1800,
        )
        marker.write_text(LITELLM_SPEC)
    return venv


def _run(command: list[str], timeout: float) -> None:
    log = CACHE / "install.log"
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InstallError(f"{command[2:5]} failed: {exc}") from None
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise InstallError(f"`{' '.join(command[-2:])}` exited {done.returncode} (see {log}): {' | '.join(tail)}")


def installed_version(venv: Path) -> str:
    """The litellm version in `venv`."""
    code = "import importlib.metadata as m; print(m.version('litellm'))"
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def mock_model(name: str, **params: Any) -> dict[str, Any]:
    """A model whose answers (or errors) LiteLLM makes up itself: no provider is called."""
    return {"model_name": name, "litellm_params": {"model": f"openai/{name}", "api_key": "sk-unused", **params}}


def config(upstream_api_url: str) -> dict[str, Any]:
    """The proxy config: one model per error class, a slow one, a rate-limited one, and one real upstream."""
    return {
        "model_list": [
            mock_model("ok", mock_response="hello from litellm"),
            mock_model("slow", mock_response="slow hello", mock_delay=1.5),
            mock_model("ratelimit", mock_response="litellm.RateLimitError"),
            mock_model("internal", mock_response="litellm.InternalServerError"),
            mock_model("ctx", mock_response="litellm.ContextWindowExceededError"),
            # LiteLLM maps this mock to ContentPolicyViolationError only for an azure deployment.
            {
                "model_name": "filter",
                "litellm_params": {
                    "model": "azure/filter",
                    "api_key": "sk-unused",
                    "api_base": "http://127.0.0.1:9",
                    "api_version": "2024-02-01",
                    "mock_response": "Exception: content_filter_policy",
                },
            },
            # One call a minute; the next gets 429 with `llm_provider-retry-after: 60`.
            mock_model("limited", mock_response="limited hello", rpm=1),
            {
                "model_name": "upstream",
                "litellm_params": {
                    "model": "openai/mock-model",
                    "api_key": "sk-upstream",
                    "api_base": upstream_api_url,
                },
            },
        ],
        "router_settings": {"optional_pre_call_checks": ["enforce_model_rate_limits"]},
        "general_settings": {"master_key": MASTER_KEY, "forward_client_headers_to_llm_api": True},
        "litellm_settings": {"num_retries": 0, "request_timeout": 30, "telemetry": False},
    }


@dataclass
class LiteLLMProxy:
    """`litellm --config` on 127.0.0.1; `kill` and `start` again keep the port."""

    venv: Path
    tmp: Path
    settings: dict[str, Any]
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 120) -> LiteLLMProxy:
        config_path = self.tmp / f"litellm-{self.port}.json"  # YAML is a superset of JSON
        config_path.write_text(json.dumps(self.settings))
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_DOCS": "True", "LITELLM_LOG": "ERROR"}
        env.pop("DATABASE_URL", None)
        command = [
            str(self.venv / "bin" / "litellm"),
            "--config",
            str(config_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        with open(self.tmp / f"litellm-{self.port}.log", "ab") as log:
            self.process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_until(self._up, timeout, f"LiteLLM to listen on {self.port}\n{self.log_tail()}", interval=0.3)
        return self

    def _up(self) -> bool:
        if self.process and self.process.poll() is not None:
            raise AssertionError(f"litellm exited with {self.process.returncode}:\n{self.log_tail()}")
        try:
            return http_json(f"http://127.0.0.1:{self.port}/health/liveliness", timeout=2)[0] == 200
        except OSError:
            return False

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join((self.tmp / f"litellm-{self.port}.log").read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL the proxy and everything it started (its own process group)."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
