"""What every CLI command shares: registration, the HTTP call to a worker, output and exit codes."""

from __future__ import annotations

import getpass
import json
import socket
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any
from urllib.parse import quote

import aiohttp
from faust.cli import option
from yarl import URL

from dlqapp.settings import Settings

EXIT_NOT_FOUND, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3

_COMMANDS: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []


def command(*options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a coroutine as a `faust -A dlqapp <name>` command (registered by `register_commands`)."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        _COMMANDS.append((fn, options))
        return fn

    return mark


def register_commands(app: Any) -> None:
    """Register every command on `app` (underscores in names become dashes)."""
    for fn, options in _COMMANDS:
        app.command(*options)(fn)


class CliError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def fail(message: str, code: int) -> None:
    print(f"dlqapp: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def segment(value: str) -> str:
    """`value` as one path segment of a URL: a request id may hold `/`, `?` or `#`, or be
    `.` or `..` (sent as `%2E`, which `call` keeps as it is: a URL library resolves dots)."""
    return quote(value, safe="").replace(".", "%2E")


def query_of(params: dict[str, Any]) -> str:
    """The query string of `params` (those None or empty left out), each value escaped."""
    return "&".join(f"{k}={segment(str(v))}" for k, v in params.items() if v not in (None, ""))


async def call(
    settings: Settings, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200,)
) -> tuple[int, Any]:
    """One HTTP call to the worker; CliError on an unreachable worker or an unexpected status."""
    url = URL(settings.web_url.rstrip("/") + path, encoded=True)  # `path` is escaped already
    headers = {"X-DLQ-Actor": f"cli:{getpass.getuser()}@{socket.gethostname()}", "Content-Type": "application/json"}
    if settings.admin_token:
        headers["Authorization"] = f"Bearer {settings.admin_token}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            data = json.dumps(body).encode() if body is not None else (b"" if method != "GET" else None)
            async with session.request(method, url, data=data, headers=headers) as response:
                data = await response.json(content_type=None)
                status = response.status
    except (TimeoutError, aiohttp.ClientConnectionError) as exc:
        raise CliError(
            f"cannot reach the dlqapp worker at {settings.web_url} ({type(exc).__name__}); set DLQ_WEB_URL",
            EXIT_UNREACHABLE,
        ) from None
    if status not in ok:
        message = (
            (data or {}).get("error") or (data or {}).get("reason") or (data or {}).get("status") or f"HTTP {status}"
        )
        if isinstance(data, dict) and data.get("reasons"):
            message += ": " + "; ".join(data["reasons"])
        raise CliError(
            message,
            EXIT_NOT_FOUND
            if status in (404, 409)
            else EXIT_USAGE
            if status == 400
            else EXIT_UNREACHABLE
            if status >= 500
            else EXIT_USAGE,
        )
    return status, data


def run(coro: Any) -> Any:
    """Await a CLI coroutine, turning CliError into a message and an exit code."""

    async def wrapped() -> Any:
        try:
            return await coro
        except CliError as exc:
            fail(str(exc), exc.code)

    return wrapped()


def when(ms: int | None) -> str:
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S") if ms else "-"


def table(rows: list[list[Any]], headers: list[str]) -> str:
    """A plain-text table sized to its content."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def progress(done: int, total: int, label: str) -> None:
    """A one-line progress bar on stderr."""
    width = 30
    filled = int(width * done / total) if total else width
    sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def emit(data: Any, as_json: bool, human: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True) if as_json else human)


JSON = option("--json", "as_json", is_flag=True, default=False, help="Machine-readable JSON output.")
