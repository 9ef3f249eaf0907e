"""Test helpers: a broker, workers as subprocesses, the mock LLM, HTTP, waiting.

Kafka produce/consume lives in tests/kafka_io.py; its names are importable from here too
(bench/ imports them from tests.support)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.kafka_io import Record, all_keys_seen, keys_seen, produce, read_topic, request_bytes  # noqa: F401 (re-exported)

ROOT = Path(__file__).resolve().parent.parent
KAFKA_LOCAL = ROOT / "scripts" / "kafka-local"
FAUST = Path(sys.executable).parent / "faust"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str | Callable[[], str], interval: float = 0.1
) -> Any:
    """Poll `predicate` until it returns something truthy; fail naming `what` on timeout
    (a callable `what` is asked then, so it can describe what was last seen)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what() if callable(what) else what}")
        time.sleep(interval)


def page_with_total(worker: Worker, path: str, total: int) -> Callable[[], Any]:
    """A `wait_until` predicate: the page `worker` answers at `path`, once its `total` is `total`."""

    def page() -> Any:
        body = worker.get(path)[1]
        return body.get("total") == total and body

    return page


def in_state(worker: Worker, state: str, *request_ids: str) -> Callable[[], bool]:
    """A `wait_until` predicate: `worker` shows every one of `request_ids` in `state`."""
    return lambda: all(worker.get(f"/requests/{rid}/")[1]["state"] == state for rid in request_ids)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def unique_ids(prefix: str, count: int) -> list[str]:
    """`count` distinct ids under one unique prefix (random ids collide at a million)."""
    run = unique(prefix)
    return [f"{run}-{i}" for i in range(count)]


# -- HTTP ------------------------------------------------------------------------------


def http_json(
    url: str,
    method: str = "GET",
    body: Any = None,
    timeout: float = 10,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """(status, decoded JSON body) of one request; `raw` sends bytes as they are instead of `body`."""
    data = raw if raw is not None else json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw.decode(errors="replace")


# -- broker ----------------------------------------------------------------------------


@dataclass
class LocalKafka:
    """A broker started by scripts/kafka-local for this test session."""

    port: int
    data_dir: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KAFKA_BROKERS": "1",
            "KAFKA_PORT": str(self.port),
            "KAFKA_CONTROLLER_PORT": str(free_port()),
            "KAFKA_DATA_DIR": str(self.data_dir),
        }

    def run(
        self, command: str, env: dict[str, str] | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(KAFKA_LOCAL), command], env=env or self.env(), capture_output=True, text=True, timeout=300, check=check
        )


# -- workers ---------------------------------------------------------------------------


@dataclass
class Worker:
    """`faust -A dlqapp worker` in a subprocess with its own app id, topics, datadir and port."""

    bootstrap: str
    tmp: Path
    app_id: str = field(default_factory=lambda: unique("app"))
    prefix: str | None = None
    env_extra: dict[str, str] = field(default_factory=dict)
    web_port: int = field(default_factory=free_port)
    name: str = "w1"
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        if self.prefix is None:
            self.prefix = f"{self.app_id}."
        self.data_dir = self.tmp / f"{self.name}-data"
        self.log_path = self.tmp / f"{self.name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def topic(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DLQ_KAFKA_BOOTSTRAP": self.bootstrap,
            "DLQ_APP_ID": self.app_id,
            "DLQ_TOPIC_PREFIX": self.prefix or "",
            "DLQ_DATA_DIR": str(self.data_dir),
            "DLQ_WEB_PORT": str(self.web_port),
            # Most tests script backend-wide failures on purpose; the breaker would hold
            # them. test_outage.py and test_breaker*.py turn it on.
            "DLQ_BREAKER": "false",
            # The tests read topics with three partitions (`read_topic`): fewer than the default.
            "DLQ_PARTITIONS": "3",
            **self.env_extra,
        }

    def start(self, wait: bool = True) -> Worker:
        with open(self.log_path, "ab") as log:  # the worker writes to its own copy of the handle
            self.process = subprocess.Popen(
                [str(FAUST), "-A", "dlqapp", "worker", "-l", "info", "--web-port", str(self.web_port)],
                cwd=self.tmp,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 120) -> None:
        """Until the worker serves HTTP and owns partitions (or fail with its log)."""

        def ready() -> bool:
            if self.process and self.process.poll() is not None:
                raise AssertionError(f"worker exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                status, body = http_json(self.url + "/", timeout=2)
            except OSError:
                return False
            return status == 200 and body.get("ready")

        try:
            wait_until(ready, timeout, f"worker {self.name} to be ready", interval=0.3)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log_tail()}") from None

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def process_state(self) -> str:
        """What the kernel says the worker's process and each of its threads are doing
        (for a failure message: a hung worker shows where it waits)."""
        if self.process is None or self.process.poll() is not None:
            return f"(process ended: {None if self.process is None else self.process.returncode})"
        proc = Path("/proc") / str(self.process.pid)
        try:
            status = [
                line for line in (proc / "status").read_text().splitlines() if line.startswith(("State", "Threads"))
            ]
            threads = [
                f"{(t / 'comm').read_text().strip()} {(t / 'stat').read_text().split()[2]} {(t / 'wchan').read_text()}"
                for t in sorted((proc / "task").iterdir())
            ]
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError as exc:
            return f"(unreadable: {exc})"
        return "\n".join([f"pid {self.process.pid}: {cmdline}", *status, *threads])

    def kill(self) -> None:
        """kill -9."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()

    def get(self, path: str) -> tuple[int, Any]:
        return http_json(self.url + path)


class Workers:
    """Workers on one broker sharing one tmp dir, named w1, w2, … in the order made.

    Each is recorded before it starts, so `kill_all` ends every one, a worker that
    never became ready included. Behind the `make_worker` and `start_worker` fixtures.
    """

    def __init__(self, bootstrap: str, tmp: Path) -> None:
        self.bootstrap = bootstrap
        self.tmp = tmp
        self.made: list[Worker] = []

    def make(self, **kwargs: Any) -> Worker:
        """A worker, not started; `kwargs` are Worker's fields (app_id, prefix, env_extra, name)."""
        worker = Worker(self.bootstrap, self.tmp, name=kwargs.pop("name", f"w{len(self.made) + 1}"), **kwargs)
        self.made.append(worker)
        return worker

    def start(self, **env: str) -> Worker:
        """A worker with its own app id and topic prefix and `env` added to its
        environment, started and ready to serve."""
        return self.make(env_extra=env).start()

    def kill_all(self) -> None:
        """kill -9 every worker made."""
        for worker in self.made:
            worker.kill()


# -- mock LLM ----------------------------------------------------------------------------

MOCK_LLM = Path(sys.executable).parent / "dlqapp-mock-llm"


@dataclass
class MockLLM:
    """`dlqapp-mock-llm` in a subprocess on a free port."""

    tmp: Path
    args: list[str] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return self.url + "/v1"

    def start(self) -> MockLLM:
        with open(self.tmp / f"mock-llm-{self.port}.log", "ab") as log:
            self.process = subprocess.Popen(
                [str(MOCK_LLM), "--port", str(self.port), *self.args], stdout=log, stderr=subprocess.STDOUT
            )
        wait_until(lambda: self._up(), 30, "the mock LLM to listen")
        return self

    def _up(self) -> bool:
        try:
            return http_json(self.url + "/_mock/stats", timeout=2)[0] == 200
        except OSError:
            return False

    def plan(self, **spec: Any) -> None:
        assert http_json(self.url + "/_mock/plan", "POST", spec)[0] == 200

    def calls(self, request_id: str) -> int:
        return http_json(self.url + f"/_mock/calls/{request_id}")[1]["calls"]

    def outage(self, on: bool) -> None:
        assert http_json(self.url + "/_mock/outage", "POST", {"on": on})[0] == 200

    def stats(self) -> dict[str, Any]:
        return http_json(self.url + "/_mock/stats")[1]

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
