"""How an OpenAI-compatible endpoint's error responses map to error classes (pure code).

Status first, then the error body refines it. The body shapes understood are those of
OpenAI and Azure OpenAI (`{"error": {"code", "type", "message", "innererror"}}`), the
LiteLLM proxy (the same, with `litellm.<Exception>` names in the message), vLLM (nested,
and the flat `{"object": "error", ...}` of vLLM before 0.10), Ollama (`{"error": "..."}`
natively, OpenAI-shaped under /v1) and TGI (`{"error": "...", "error_type": "..."}`);
tests/fixtures/gateway_errors.json holds one real body per case.

Refinements: `insufficient_quota` / `budget_exceeded` (or HTTP 402) is a quota problem, a
400/413/422 about the context window is `context_length`, a content-policy refusal is
`content_filter`. `x-should-retry`, when present, overrides whether the failure is retried.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from dlqapp.core.errors import ErrorClass, Failure

CONTEXT_MARKERS = (
    "context_length_exceeded",
    "context length",  # OpenAI, vLLM, Ollama ("longer than the context length")
    "maximum context",
    "contextwindowexceeded",  # LiteLLM's ContextWindowExceededError
    "context window",
    "maximum model length",  # vLLM: "longer than the maximum model length"
    "prompt is too long",  # Anthropic through a gateway
    "too many tokens",
    "string_above_max_length",
    "`inputs` tokens + `max_new_tokens` must be",  # TGI
    "`inputs` must have less than",  # TGI
)
NOT_CONTEXT_MARKERS = ("invalid 'user'",)
"""OpenAI's `string_above_max_length` for the `user` field is a plain bad request."""
CONTENT_MARKERS = (
    "content_filter",
    "content_policy",
    "contentpolicyviolation",  # LiteLLM's ContentPolicyViolationError
    "responsibleaipolicyviolation",  # Azure innererror code
    "content management policy",
    "responsible ai",
    "safety system",
    "invalid_prompt",  # OpenAI: "flagged as potentially violating our usage policy"
    "violating our usage policy",
)
QUOTA_MARKERS = ("insufficient_quota", "quota", "budget_exceeded", "billing_hard_limit")
QUOTA_STATUSES = (400, 403, 429)
FORWARDED_PREFIX = "llm_provider-"
"""LiteLLM forwards a provider's response headers with this prefix (`llm_provider-retry-after`)."""
RESET_PREFIX = "x-ratelimit-reset-"
REMAINING_PREFIX = "x-ratelimit-remaining-"
DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|us|µs|ns|h|m|s)")
DURATION_UNIT_MS = {"h": 3_600_000.0, "m": 60_000.0, "s": 1000.0, "ms": 1.0, "us": 0.001, "µs": 0.001, "ns": 0.000001}
RETRY_HINT = re.compile(
    r"(?:try again in|retry after|retry in)\s+"
    r"((?:\d+(?:\.\d+)?(?:ms|h|m|s))+|\d+(?:\.\d+)?)\s*(seconds?|secs?|milliseconds?)?\b",
    re.IGNORECASE,
)
"""`Please try again in 6ms.` (OpenAI), `Please retry after 7 seconds.` (Azure)."""


def header_map(headers: Mapping[str, str]) -> dict[str, str]:
    """Lower-cased headers; a LiteLLM-forwarded `llm_provider-X` stands in for a missing `X`."""
    plain = {k.lower(): v for k, v in headers.items()}
    forwarded = {k[len(FORWARDED_PREFIX) :]: v for k, v in plain.items() if k.startswith(FORWARDED_PREFIX)}
    return {**forwarded, **plain}


def retry_after_ms(headers: Mapping[str, str], now: float | None = None, message: str = "") -> int | None:
    """Delay asked for, most precise first.

    `retry-after-ms`, then `retry-after` (seconds or HTTP date), then a delay stated in
    `message` (`try again in 18.642s`), then the `x-ratelimit-reset-*` durations
    (`1s`, `6m0s`, `20ms`). LiteLLM's `llm_provider-` copies count when the plain header is absent.
    """
    h = header_map(headers)
    ms = _number(h.get("retry-after-ms"))
    if ms is not None:
        return max(0, int(ms))
    value = h.get("retry-after")
    if value:
        seconds = _number(value)
        delay = int(seconds * 1000) if seconds is not None else _until_ms(value, now)
        if delay is not None:
            return max(0, delay)
    hinted = message_retry_ms(message) if message else None
    return hinted if hinted is not None else rate_limit_reset_ms(h, now)


def rate_limit_reset_ms(headers: Mapping[str, str], now: float | None = None) -> int | None:
    """From `x-ratelimit-reset-<kind>`: the longest reset of the exhausted kinds, else the soonest.

    A kind is exhausted when `x-ratelimit-remaining-<kind>` is 0. Without one, the soonest
    reset is the earliest moment anything frees up.
    """
    headers = header_map(headers)
    resets = {}
    for name, value in headers.items():
        if name.startswith(RESET_PREFIX) and (ms := reset_ms(value, now)) is not None:
            resets[name[len(RESET_PREFIX) :]] = ms
    if not resets:
        return None
    exhausted = [ms for kind, ms in resets.items() if _number(headers.get(REMAINING_PREFIX + kind)) == 0]
    return max(exhausted) if exhausted else min(resets.values())


def reset_ms(value: str, now: float | None = None) -> int | None:
    """A reset header value: a Go duration (`6m0s`), seconds (`1.5`) or a timestamp."""
    value = value.strip()
    duration = duration_ms(value)
    if duration is not None:
        return duration
    seconds = _number(value)
    return max(0, int(seconds * 1000)) if seconds is not None else _until_ms(value, now)


def duration_ms(value: str) -> int | None:
    """`1h2m3.5s`, `6m0s`, `20ms` in milliseconds; None when not such a duration."""
    value = value.strip()
    if not value or DURATION_PART.sub("", value):
        return None
    return int(sum(float(n) * DURATION_UNIT_MS[unit] for n, unit in DURATION_PART.findall(value)))


def message_retry_ms(message: str) -> int | None:
    """A delay stated in the error message (`try again in 18.642s`), when no header gave one."""
    match = RETRY_HINT.search(message)
    if match is None:
        return None
    amount, unit = match.group(1).lower(), (match.group(2) or "").lower()
    duration = duration_ms(amount)
    if duration is not None:
        return duration
    return int(float(amount)) if unit.startswith("milli") else int(float(amount) * 1000)


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _until_ms(value: str, now: float | None) -> int | None:
    """Milliseconds from now until an HTTP date or an ISO 8601 timestamp."""
    moment = None
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return None
    if moment is None or moment.tzinfo is None:
        return None
    return max(0, int((moment.timestamp() - (now if now is not None else time.time())) * 1000))


def error_text(body: Any) -> tuple[str, str]:
    """(codes and types, message) of an error body in any of the known shapes, lower-cased."""
    if isinstance(body, str):
        return "", body.lower()
    if not isinstance(body, dict):
        return "", ""
    error = body.get("error")
    if isinstance(error, dict):
        fields = error
    elif isinstance(error, str):
        fields = {"message": error, "type": body.get("error_type")}  # Ollama, TGI
    else:
        fields = body  # vLLM before 0.10: {"object": "error", "message", "type", "code"}
    inner = fields.get("innererror")
    codes = [fields.get("code"), fields.get("type"), inner.get("code") if isinstance(inner, dict) else None]
    code = " ".join(str(c) for c in codes if c not in (None, "")).lower()
    message = fields.get("message") or fields.get("detail") or ""
    return code, str(message).lower()


def _status_class(status: int) -> ErrorClass:
    if status in (408, 409, 424) or status >= 500:
        return ErrorClass.SERVER_ERROR
    if status == 429:
        return ErrorClass.RATE_LIMITED
    if status in (401, 403):
        return ErrorClass.AUTH_ERROR
    if status == 402:
        return ErrorClass.QUOTA_EXCEEDED
    if status in (400, 404, 413, 422):
        return ErrorClass.INVALID_REQUEST
    return ErrorClass.UNKNOWN


def _is_context(text: str) -> bool:
    return any(m in text for m in CONTEXT_MARKERS) and not any(m in text for m in NOT_CONTEXT_MARKERS)


def classify_status_and_body(status: int, body: Any) -> ErrorClass:
    """The error class of a status and an error body (headers aside)."""
    code, message = error_text(body)
    text = f"{code} {message}"
    if status in QUOTA_STATUSES and any(m in code for m in QUOTA_MARKERS):
        return ErrorClass.QUOTA_EXCEEDED
    if status in (400, 413, 422) and _is_context(text):
        return ErrorClass.CONTEXT_LENGTH
    if status in (400, 403, 422) and any(m in text for m in CONTENT_MARKERS):
        return ErrorClass.CONTENT_FILTER
    return _status_class(status)


def classify_response(status: int, headers: Mapping[str, str], *, body: Any, now: float | None = None) -> Failure:
    """The failure an HTTP error response stands for."""
    code, message = error_text(body)
    error_class = classify_status_and_body(status, body)
    h = header_map(headers)
    should_retry = h.get("x-should-retry")
    retryable = None if should_retry is None else should_retry.strip().lower() == "true"
    delay = None
    if error_class in (ErrorClass.RATE_LIMITED, ErrorClass.SERVER_ERROR) or retryable:
        delay = retry_after_ms(h, now, message if error_class is ErrorClass.RATE_LIMITED else "")
    summary = (
        f"HTTP {status}" + (f" {code.strip()}" if code.strip() else "") + (f": {message[:300]}" if message else "")
    )
    return Failure(error_class, summary, delay, retryable)
