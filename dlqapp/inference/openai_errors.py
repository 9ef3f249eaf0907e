"""How an OpenAI-compatible endpoint's error responses map to error classes (pure code).

Status first, then the error body (`{"error": {"code", "type", "message"}}`) refines it:
429 `insufficient_quota` is a quota problem, a 400 about context length is
`context_length`, a content-policy refusal is `content_filter`. `x-should-retry`, when
present, overrides whether the failure is retried.
"""

from __future__ import annotations

import email.utils
import time
from typing import Any, Mapping

from dlqapp.classification import ErrorClass, Failure

CONTEXT_MARKERS = ("context_length_exceeded", "context length", "maximum context", "too many tokens", "string_above_max_length")
CONTENT_MARKERS = ("content_filter", "content_policy", "content management policy", "responsible ai", "safety system")
QUOTA_MARKERS = ("insufficient_quota", "quota")


def retry_after_ms(headers: Mapping[str, str], now: float | None = None) -> int | None:
    """Delay asked for by `retry-after-ms`, `retry-after` (seconds) or `retry-after` (HTTP date)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    if "retry-after-ms" in lowered:
        try:
            return max(0, int(float(lowered["retry-after-ms"])))
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if not value:
        return None
    try:
        return max(0, int(float(value) * 1000))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if _looks_like_date(value) else None
        if parsed is None:
            return None
        return max(0, int((parsed.timestamp() - (now if now is not None else time.time())) * 1000))


def _looks_like_date(value: str) -> bool:
    try:
        return email.utils.parsedate_to_datetime(value) is not None
    except (TypeError, ValueError):
        return False


def _error_text(body: Any) -> tuple[str, str]:
    """(code and type, message) of an OpenAI error body, lower-cased."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = " ".join(str(error.get(k) or "") for k in ("code", "type"))
        return code.lower(), str(error.get("message") or "").lower()
    if isinstance(error, str):
        return "", error.lower()
    return "", ""


def _status_class(status: int) -> ErrorClass:
    if status in (408, 409) or status >= 500:
        return ErrorClass.SERVER_ERROR
    if status == 429:
        return ErrorClass.RATE_LIMITED
    if status in (401, 403):
        return ErrorClass.AUTH_ERROR
    if status in (400, 404, 413, 422):
        return ErrorClass.INVALID_REQUEST
    return ErrorClass.UNKNOWN


def classify_response(status: int, headers: Mapping[str, str], body: Any, now: float | None = None) -> Failure:
    """The failure an HTTP error response stands for."""
    code, message = _error_text(body)
    text = f"{code} {message}"
    error_class = _status_class(status)
    if status == 429 and any(m in code for m in QUOTA_MARKERS):
        error_class = ErrorClass.QUOTA_EXCEEDED
    elif status in (400, 413, 422) and any(m in text for m in CONTEXT_MARKERS):
        error_class = ErrorClass.CONTEXT_LENGTH
    elif status in (400, 403, 422) and any(m in text for m in CONTENT_MARKERS):
        error_class = ErrorClass.CONTENT_FILTER
    should_retry = {k.lower(): v for k, v in headers.items()}.get("x-should-retry")
    retryable = None if should_retry is None else should_retry.strip().lower() == "true"
    delay = retry_after_ms(headers, now) if error_class is ErrorClass.RATE_LIMITED or retryable else None
    summary = f"HTTP {status}" + (f" {code.strip()}" if code.strip() else "") + (f": {message[:300]}" if message else "")
    return Failure(error_class, summary, delay, retryable)
