"""The request schema: decode and validate the bytes that arrive on `input`.

Pure code: no Faust, no Kafka.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from dlqapp.core import compact_json

MAX_REQUEST_ID_CHARS = 256
PRIORITIES = ("high", "normal", "low")
MAX_DEADLINE_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z: a larger `deadline` is not epoch milliseconds."""
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


# Header names (public contract: retry_count, scheduled_time, original_timestamp,
# error_class, last_error, final_error).
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
    deadline: int | None = None
    """Epoch ms after which the request is dead-lettered as `expired` without a call."""
    priority: str = "normal"
    """`high`, `normal` or `low`: the order fresh requests get backend slots in."""


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


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: the only way a payload that decodes as UTF-8 can
hold one (a pair is joined into one character by the parser; a lone one stays)."""
LONE_SURROGATE = "payload holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape without its pair): not valid Unicode"


def lone_surrogate(data: Any) -> bool:
    """Whether a decoded JSON value holds a string UTF-8 cannot carry (a lone surrogate): it
    would break every JSON answer, metric label and key made of it."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _holds_lone_surrogate(raw: bytes, data: Any) -> bool:
    """`lone_surrogate(data)`, looked at only when `raw` (its JSON text) holds a surrogate escape."""
    return _SURROGATE_ESCAPE.search(raw) is not None and lone_surrogate(data)


def loads_shown(text: str | bytes) -> Any:
    """JSON from elsewhere (a provider's answer, a stored payload) as dlqapp can show, label
    and key it: lone surrogates replaced (`without_lone_surrogates`). ValueError when not JSON."""
    data = compact_json.loads(text)
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return without_lone_surrogates(data) if _holds_lone_surrogate(raw, data) else data


def without_lone_surrogates(data: Any) -> Any:
    """A decoded JSON value as UTF-8 can carry it: lone surrogates replaced by `?` (for showing
    a payload dlqapp refused for holding them; its bytes are kept as they were)."""
    if isinstance(data, str):
        return data if _encodable(data) else data.encode("utf-8", "replace").decode("utf-8")
    if isinstance(data, list):
        return [without_lone_surrogates(item) for item in data]
    if isinstance(data, dict):
        return {without_lone_surrogates(k): without_lone_surrogates(v) for k, v in data.items()}
    return data


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
        data = compact_json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InvalidRequest([f"payload is not valid JSON: {exc}"]) from None
    if not isinstance(data, dict):
        raise InvalidRequest([f"payload must be a JSON object, not {type(data).__name__}"])
    if _holds_lone_surrogate(payload, data):
        try:
            validate_request(data)
            more: list[str] = []
        except InvalidRequest as exc:
            more = exc.reasons
        raise InvalidRequest([LONE_SURROGATE, *more], _valid_request_id(data.get("request_id")))
    return validate_request(data)


def validate_request(data: dict[str, Any]) -> Request:
    """Validate a decoded request object (also used for operator edits)."""
    problems: list[str] = []
    request_id = _valid_request_id(data.get("request_id"))
    if request_id is None:
        problems.append(f"request_id must be a non-empty UTF-8 string of at most {MAX_REQUEST_ID_CHARS} characters")
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
    problems.extend(_check_flow_fields(data))
    if problems or request_id is None:  # a missing request id is among the problems
        raise InvalidRequest(problems, request_id)
    return Request(
        request_id=request_id,
        model=data.get("model"),
        messages=messages,
        prompt=prompt,
        params=data.get("params") or {},
        metadata=data.get("metadata") or {},
        deadline=data.get("deadline"),
        priority=data.get("priority") or "normal",
    )


def _check_flow_fields(data: dict[str, Any]) -> list[str]:
    """`deadline` (epoch ms) and `priority`, both optional."""
    problems = []
    deadline = data.get("deadline")
    if deadline is not None and not (
        isinstance(deadline, int) and not isinstance(deadline, bool) and 0 < deadline <= MAX_DEADLINE_MS
    ):
        problems.append("deadline must be a positive integer: epoch milliseconds")
    priority = data.get("priority")
    if priority is not None and priority not in PRIORITIES:
        problems.append(f"priority must be one of {list(PRIORITIES)}")
    return problems


def salvage_request_id(payload: bytes | None) -> str | None:
    """The request id of an invalid payload, when one can still be read."""
    if not payload:
        return None
    try:
        data = compact_json.loads(payload)
    except (ValueError, RecursionError):
        return None
    return _valid_request_id(data.get("request_id")) if isinstance(data, dict) else None


def fallback_key(payload: bytes | None) -> str:
    """A stable key for a payload without a readable request id: a digest of its bytes."""
    return "invalid-" + hashlib.sha256(payload or b"").hexdigest()[:32]
