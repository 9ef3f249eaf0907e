"""CLI commands (`faust -A dlqapp <command>`): they talk to a running worker over HTTP.

`DLQ_WEB_URL` names the worker; `DLQ_ADMIN_TOKEN`, when set, is sent as a bearer token.
Human tables by default, `--json` for scripts. Exit codes: 0 ok, 1 not found or refused,
2 bad usage, 3 worker unreachable.
"""

from dlqapp.cli import dlq_commands, kafka_commands, retry_commands  # noqa: F401 - importing them registers their commands
from dlqapp.cli.base import register_commands

__all__ = ["register_commands"]
