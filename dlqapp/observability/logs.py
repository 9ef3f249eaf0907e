"""Structured logging: `event key=value …` lines, or one JSON object per line."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dlqapp.settings import Settings

LOGGER_NAME = "dlqapp"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, event, and the record's fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": getattr(record, "event", None) or record.getMessage(),
            **getattr(record, "fields", {}),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure_logging(settings: Settings) -> None:
    """Set the level of dlqapp's loggers (DLQ_LOG_LEVEL)."""
    logging.getLogger(LOGGER_NAME).setLevel(settings.log_level.upper())


class LibraryDetail(logging.Filter):
    """Faust's, mode's and aiokafka's INFO lines (a line per partition, per service start,
    recovery tables) are detail: shown at DEBUG only. dlqapp logs one line per phase
    instead; warnings and errors of every library always pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING or logging.getLogger().getEffectiveLevel() <= logging.DEBUG:
            return True
        # mode's services (dlqapp's own included) log "[^--Name]: Starting..." lines.
        return record.name.startswith(LOGGER_NAME) and not str(record.msg).startswith("[^")


def apply_log_format(settings: Settings, root: logging.Logger | None = None) -> None:
    """Quiet the libraries' INFO lines (LibraryDetail) and, with DLQ_LOG_FORMAT=json,
    write every line as JSON, on the handlers of `root` (default: the root logger).

    Runs as soon as the worker has set up logging (dlqapp.wiring.worker), before its first
    line, and again as the app starts.
    """
    for handler in (root or logging.getLogger()).handlers:
        if not any(isinstance(f, LibraryDetail) for f in handler.filters):
            handler.addFilter(LibraryDetail())
        if settings.log_format == "json":
            handler.setFormatter(JsonFormatter())


def _render(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (not text or any(c in text for c in ' ="\n')) else text


def log_event(logger: logging.Logger, level: int, event: str, **fields: Any) -> None:
    """Log `event` with fields: `event k=v …` in text, separate keys in JSON."""
    if not logger.isEnabledFor(level):
        return
    line = " ".join([event, *(f"{k}={_render(v)}" for k, v in fields.items() if v is not None)])
    logger.log(level, line, extra={"event": event, "fields": fields})


def log_breaker_move(previous: str, new: str, open_ms: int | None) -> None:
    """The circuit breaker changed state: a warning when it opens, else info."""
    level = logging.WARNING if new == "open" else logging.INFO
    log_event(logging.getLogger("dlqapp.core.breaker"), level, f"breaker_{new}", previous=previous, open_ms=open_ms)
