"""Structured logging: `event key=value …` lines, or one JSON object per line."""

from __future__ import annotations

import json
import logging
from typing import Any

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
    """Set dlqapp's level, and its format when DLQ_LOG_FORMAT=json."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(settings.log_level.upper())
    if settings.log_format == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
        logger.addHandler(handler)
        logger.propagate = False


def _render(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (not text or any(c in text for c in ' ="\n')) else text


def log_event(logger: logging.Logger, level: int, event: str, **fields: Any) -> None:
    """Log `event` with fields: `event k=v …` in text, separate keys in JSON."""
    if not logger.isEnabledFor(level):
        return
    line = " ".join([event, *(f"{k}={_render(v)}" for k, v in fields.items() if v is not None)])
    logger.log(level, line, extra={"event": event, "fields": fields})
