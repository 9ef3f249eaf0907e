"""A secured broker for the tests: scripts/kafka-local with KAFKA_SECURITY (and ACLs), the
files it writes (client.env, admin.properties), and Kafka's own AclCommand."""

from __future__ import annotations

import os
import ssl
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.kafka_tools import kafka_jars
from tests.support import FAUST, KAFKA_LOCAL, Worker, Workers, free_port


@dataclass
class SecureKafka:
    """One broker started secured; `security` is a KAFKA_SECURITY value."""

    data_dir: Path
    security: str = "sasl_ssl"
    authorizer: bool = True

    def __post_init__(self) -> None:
        self.port = free_port()
        self.controller_port = free_port()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KAFKA_BROKERS": "1",
            "KAFKA_PORT": str(self.port),
            "KAFKA_CONTROLLER_PORT": str(self.controller_port),
            "KAFKA_DATA_DIR": str(self.data_dir),
            "KAFKA_SECURITY": self.security,
            "KAFKA_AUTHORIZER": "1" if self.authorizer else "0",
        }

    def run(self, command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(KAFKA_LOCAL), command], env=self.env(), capture_output=True, text=True, timeout=300, check=check
        )

    def start(self) -> SecureKafka:
        result = self.run("start", check=False)
        log = self.data_dir / "kafka.log"
        assert result.returncode == 0, (
            result.stdout + result.stderr + (log.read_text(errors="replace")[-3000:] if log.exists() else "")
        )
        return self

    def stop(self) -> None:
        self.run("stop", check=False)

    def client_env(self) -> dict[str, str]:
        """The DLQ_KAFKA_* lines kafka-local wrote for the user dlqapp."""
        lines = (self.data_dir / "client.env").read_text().splitlines()
        return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))

    def secret(self, user: str) -> str:
        return (self.data_dir / "security" / f"{user}.password").read_text()

    def admin_client(self) -> dict[str, Any]:
        """aiokafka options of the super user admin (reads every topic, whatever the ACLs)."""
        security = self.data_dir / "security"
        options: dict[str, Any] = {"security_protocol": self.security.upper()}
        if self.security in ("ssl", "sasl_ssl"):
            context = ssl.create_default_context(cafile=str(security / "ca.pem"))
            if self.security == "ssl":
                context.load_cert_chain(str(security / "admin.pem"), str(security / "admin.key"))
            options["ssl_context"] = context
        if self.security.startswith("sasl"):
            options.update(
                sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="admin", sasl_plain_password=self.secret("admin")
            )
        return options

    def kafka_tool(self, main_class: str, *args: str) -> subprocess.CompletedProcess[str]:
        """One of Kafka's command-line tools, as the super user admin (admin.properties)."""
        command = [
            "java",
            "-XX:TieredStopAtLevel=1",
            "-cp",
            f"{kafka_jars()}/*",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            main_class,
            "--bootstrap-server",
            self.bootstrap,
            "--command-config",
            str(self.data_dir / "admin.properties"),
            *args,
        ]
        return subprocess.run(command, capture_output=True, text=True, timeout=180)

    def apply_acls(self, worker: Worker, principal: str = "User:dlqapp", skip: str | None = None) -> list[str]:
        """Grant exactly what `faust -A dlqapp acls` prints for the worker's settings (but lines
        containing `skip`), with Kafka's AclCommand. Returns the lines applied."""
        printed = subprocess.run(
            [str(FAUST), "-A", "dlqapp", "acls", "--principal", principal],
            env=worker.env(),
            cwd=worker.tmp,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert printed.returncode == 0, printed.stderr
        lines = [line for line in printed.stdout.splitlines() if line.strip() and not (skip and skip in line)]
        with ThreadPoolExecutor(4) as pool:
            results = list(
                pool.map(lambda line: self.kafka_tool("org.apache.kafka.tools.AclCommand", *line.split()), lines)
            )
        for line, result in zip(lines, results, strict=True):
            assert result.returncode == 0, f"AclCommand {line}: {result.stderr[-2000:]}"
        return lines


def secured_worker(kafka: SecureKafka, tmp: Path, **kwargs: Any) -> Worker:
    """A worker whose Kafka settings are the client.env kafka-local wrote."""
    env = {**kafka.client_env(), **kwargs.pop("env_extra", {})}
    return Workers(kafka.bootstrap, tmp).make(env_extra=env, **kwargs)
