"""Records that travel through dlqapp: requests, retry envelopes, results, dead letters.

Pure code: no Faust, no Kafka. A request's original bytes are carried unchanged from
`input` to `results` or `dlq`; everything dlqapp learns about it travels in headers.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

MAX_REQUEST_ID_CHARS = 256
HISTORY_LIMIT = 50
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})

# Header names (public contract: retry_count, scheduled_time, original_timestamp,
# error_class, last_error, final_error).
H_RETRY_COUNT = "retry_count"
H_ATTEMPTS = "attempts"
H_SCHEDULED_TIME = "scheduled_time"
H_ORIGINAL_TIMESTAMP = "original_timestamp"
H_ERROR_CLASS = "error_class"
H_LAST_ERROR = "last_error"
H_FINAL_ERROR = "final_error"
H_HISTORY = "attempt_history"
H_REQUEST_ID = "request_id"
H_SOURCE = "source"
H_DEAD_AT = "dead_at"
H_REPLAY_OF = "replay_of"
H_REPLAY_COUNT = "replay_count"


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds."""
    return time.time_ns() // 1_000_000


class InvalidRequest(ValueError):
    """A payload that is not a valid request. `request_id` is set when one could be read."""

    def __init__(self, reasons: list[str], request_id: str | None = None):
        super().__init__("; ".join(reasons))
        self.reasons = reasons
        self.request_id = request_id


@dataclass(frozen=True)
class Request:
    """A validated inference request."""

    request_id: str
    model: str | None
    messages: list[dict[str, Any]] | None
    prompt: str | None
    params: dict[str, Any]
    metadata: dict[str, Any]


def _valid_request_id(value: Any) -> str | None:
    if isinstance(value, str) and value.strip() and len(value) <= MAX_REQUEST_ID_CHARS and _encodable(value):
        return value
    return None


def _encodable(text: str) -> bool:
    """False for strings JSON allows but UTF-8 cannot carry (lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_messages(messages: Any) -> list[str]:
    if not isinstance(messages, list) or not messages:
        return ["messages must be a non-empty list"]
    problems = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            problems.append(f"messages[{i}] must be an object")
        elif message.get("role") not in CHAT_ROLES:
            problems.append(f"messages[{i}].role must be one of {sorted(CHAT_ROLES)}")
        elif not isinstance(message.get("content"), (str, list, type(None))):
            problems.append(f"messages[{i}].content must be a string, a list of parts or null")
    return problems


def parse_request(payload: bytes | None, max_bytes: int) -> Request:
    """Decode and validate a request payload, or raise `InvalidRequest` with every reason."""
    if payload is None or len(payload) == 0:
        raise InvalidRequest(["empty payload"])
    if len(payload) > max_bytes:
        raise InvalidRequest([f"payload is {len(payload)} bytes, over the {max_bytes}-byte limit"])
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(["payload is not valid UTF-8"]) from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InvalidRequest([f"payload is not valid JSON: {exc}"]) from None
    if not isinstance(data, dict):
        raise InvalidRequest([f"payload must be a JSON object, not {type(data).__name__}"])
    return validate_request(data)


def validate_request(data: dict[str, Any]) -> Request:
    """Validate a decoded request object (also used for operator edits)."""
    problems: list[str] = []
    request_id = _valid_request_id(data.get("request_id"))
    if request_id is None:
        problems.append(
            f"request_id must be a non-empty UTF-8 string of at most {MAX_REQUEST_ID_CHARS} characters"
        )
    messages, prompt = data.get("messages"), data.get("prompt")
    if messages is None and prompt is None:
        problems.append("either messages or prompt is required")
    if messages is not None:
        problems.extend(_check_messages(messages))
    if prompt is not None and not (isinstance(prompt, str) and prompt):
        problems.append("prompt must be a non-empty string")
    for name, kind in (("model", str), ("params", dict), ("metadata", dict)):
        if data.get(name) is not None and not isinstance(data[name], kind):
            problems.append(f"{name} must be {'a string' if kind is str else 'an object'}")
    if problems:
        raise InvalidRequest(problems, request_id)
    return Request(
        request_id=request_id,  # type: ignore[arg-type]
        model=data.get("model"),
        messages=messages,
        prompt=prompt,
        params=data.get("params") or {},
        metadata=data.get("metadata") or {},
    )


def salvage_request_id(payload: bytes | None) -> str | None:
    """The request id of an invalid payload, when one can still be read."""
    if not payload:
        return None
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    return _valid_request_id(data.get("request_id")) if isinstance(data, dict) else None


def fallback_key(payload: bytes | None) -> str:
    """A stable key for a payload without a readable request id: a digest of its bytes."""
    return "invalid-" + hashlib.sha256(payload or b"").hexdigest()[:32]


@dataclass
class Attempt:
    """One entry of a request's attempt history."""

    attempt: int
    at: int
    topic: str
    scheduled: int | None = None
    duration_ms: int | None = None
    error_class: str | None = None
    error: str | None = None


@dataclass
class Envelope:
    """A request in flight: its original bytes plus everything learnt about it so far.

    Serialised as Kafka headers on the tier, due and dlq topics, and as one blob in the
    parked-retry table. `attempts` counts attempts made so far; the `retry_count`
    header is the number of the retry a tier message waits for (1, 2, 3), which is the same.
    """

    request_id: str
    payload: bytes
    original_timestamp: int
    source: dict[str, Any]
    attempts: int = 0
    scheduled_time: int | None = None
    error_class: str | None = None
    last_error: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    lineage: dict[str, str] = field(default_factory=dict)

    def record(self, attempt: Attempt) -> None:
        """Append an attempt to the history (bounded) and update the last error."""
        self.attempts = attempt.attempt
        self.error_class = attempt.error_class
        self.last_error = attempt.error
        self.history.append(asdict(attempt))
        del self.history[:-HISTORY_LIMIT]

    def headers(self, **extra: str | int | None) -> list[tuple[str, bytes]]:
        """Kafka headers for this envelope, plus any `extra` (None values are left out)."""
        values: dict[str, Any] = {
            H_REQUEST_ID: self.request_id,
            H_RETRY_COUNT: self.attempts,
            H_ATTEMPTS: self.attempts,
            H_SCHEDULED_TIME: self.scheduled_time,
            H_ORIGINAL_TIMESTAMP: self.original_timestamp,
            H_ERROR_CLASS: self.error_class,
            H_LAST_ERROR: self.last_error,
            H_HISTORY: json.dumps(self.history, separators=(",", ":")),
            H_SOURCE: json.dumps(self.source, separators=(",", ":")),
            **self.lineage,
            **extra,
        }
        return [(k, str(v).encode()) for k, v in values.items() if v is not None]

    @classmethod
    def from_headers(
        cls, request_id: str, payload: bytes, headers: Mapping[str, Any] | Iterable[tuple[str, Any]] | None
    ) -> "Envelope":
        """Rebuild an envelope from Kafka headers written by `headers()`.

        Never raises: a malformed value is read as absent.
        """
        h = header_dict(headers)
        lineage = {H_REPLAY_OF: h[H_REPLAY_OF][:200]} if H_REPLAY_OF in h else {}
        replay_count = header_int(h, H_REPLAY_COUNT)
        if replay_count is not None:
            lineage[H_REPLAY_COUNT] = str(replay_count)
        return cls(
            request_id=request_id,
            payload=payload,
            original_timestamp=header_int(h, H_ORIGINAL_TIMESTAMP) or now_ms(),
            source=header_json(h, H_SOURCE, dict) or {},
            attempts=header_int(h, H_ATTEMPTS) or header_int(h, H_RETRY_COUNT) or 0,
            scheduled_time=header_int(h, H_SCHEDULED_TIME),
            error_class=h.get(H_ERROR_CLASS),
            last_error=h.get(H_LAST_ERROR),
            history=[a for a in header_json(h, H_HISTORY, list) or [] if isinstance(a, dict)],
            lineage=lineage,
        )

    def to_bytes(self) -> bytes:
        """One blob for the parked-retry table: JSON headers, a newline, the payload."""
        meta = {k: v for k, v in self.headers()}
        return json.dumps({k: v.decode() for k, v in meta.items()}).encode() + b"\n" + self.payload

    @classmethod
    def from_bytes(cls, blob: bytes) -> "Envelope":
        meta_raw, _, payload = blob.partition(b"\n")
        meta = json.loads(meta_raw)
        return cls.from_headers(meta[H_REQUEST_ID], payload, meta)


def header_dict(headers: Mapping[str, Any] | Iterable[tuple[str, Any]] | None) -> dict[str, str]:
    """Kafka headers (mapping or pairs, bytes or str values) as a str → str dict.

    Never raises: undecodable bytes are replaced, a missing value is empty, and of a
    repeated name the last value wins.
    """
    if headers is None:
        return {}
    try:
        items = list(headers.items() if isinstance(headers, Mapping) else headers)
    except (TypeError, ValueError):
        return {}
    out: dict[str, str] = {}
    for item in items:
        try:
            key, value = item
        except (TypeError, ValueError):
            continue
        if isinstance(key, (bytes, bytearray)):
            key = bytes(key).decode("utf-8", "replace")
        if isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode("utf-8", "replace")
        out[str(key)] = "" if value is None else str(value)
    return out


MAX_HEADER_INT = 2**63 - 1


def header_int(headers: Mapping[str, str], name: str) -> int | None:
    """A non-negative integer header, or None when absent or malformed."""
    value = headers.get(name)
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        return None
    number = int(text)
    return number if number <= MAX_HEADER_INT else None


def header_json(headers: Mapping[str, str], name: str, kind: type) -> Any:
    """A JSON header of type `kind`, or None when absent or malformed."""
    value = headers.get(name)
    if value is None:
        return None
    try:
        data = json.loads(value)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, kind) else None


@dataclass
class Result:
    """A successful inference, published on `results` keyed by request id."""

    request_id: str
    model: str
    output: str
    attempts: int
    latency_ms: int
    completed_at: int
    metadata: dict[str, Any]
    usage: dict[str, Any] | None = None
    history: list[dict[str, Any]] | None = None

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()
