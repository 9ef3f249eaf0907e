"""What a replay would cost: a simple prompt-token estimate of dead letters, and the tokens
one replay is expected to use (`replay_tokens`: recorded usage where a provider reported one).

The estimate is the number of characters of the request's prompt text (every string
`content` of `messages`, text parts of structured content, and `prompt`) divided by 4,
rounded up: the usual rule of thumb for English text with OpenAI-style tokenizers. A
payload that is not a JSON request counts its bytes divided by 4. No tokenizer is loaded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 4
METHOD = "prompt characters / 4, a rule of thumb (no tokenizer)"


def prompt_text(request: Any) -> str | None:
    """The prompt text of a request payload, or None when it is not a request object."""
    if not isinstance(request, dict):
        return None
    parts: list[str] = []
    if isinstance(request.get("prompt"), str):
        parts.append(request["prompt"])
    for message in request.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return "\n".join(parts)


def estimated_tokens(payload_text: str | None, payload_bytes: int) -> int:
    """Estimated prompt tokens of one DLQ entry's payload (see the module docstring)."""
    try:
        prompt = prompt_text(json.loads(payload_text)) if payload_text is not None else None
    except ValueError:
        prompt = None
    if prompt is None:
        return math.ceil((payload_bytes or 0) / CHARS_PER_TOKEN)
    return math.ceil(len(prompt) / CHARS_PER_TOKEN)


DEFAULT_COMPLETION_TOKENS = 256
"""The completion budget of a request that names no `max_tokens` (as in dlqapp.flowcontrol.estimate)."""


@dataclass(frozen=True)
class ReplayTokens:
    """What one replay is expected to use, and where the figure comes from."""

    prompt: int
    completion: int
    cached: int
    recorded: bool
    """True: the usage a provider reported for one of its attempts; False: the rule of thumb
    (prompt characters / 4 + 4 a message, and the completion budget)."""


def replay_tokens(history: list[dict[str, Any]], payload_text: str | None, payload_bytes: int) -> ReplayTokens:
    """Tokens one replay of a dead letter would use: the last attempt whose tokens the provider
    reported (a call that answered, e.g. a content filter's), else the estimate."""
    for attempt in reversed(history or []):
        tokens = attempt.get("tokens") if isinstance(attempt, dict) else None
        if isinstance(tokens, dict) and not attempt.get("tokens_estimated") and (tokens.get("prompt") or 0) > 0:
            return ReplayTokens(
                _count(tokens.get("prompt")), _count(tokens.get("completion")), _count(tokens.get("cached")), True
            )
    try:
        request = json.loads(payload_text) if payload_text is not None else None
    except ValueError:
        request = None
    prompt = estimated_tokens(payload_text, payload_bytes)
    if isinstance(request, dict):
        messages = request.get("messages")
        prompt += 4 * (len(messages) if isinstance(messages, list) and messages else 1)
        raw_params = request.get("params")
        params: dict[str, Any] = raw_params if isinstance(raw_params, dict) else {}
        budget = params.get("max_completion_tokens") or params.get("max_tokens")
        completion = budget if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0 else 0
        completion = completion or DEFAULT_COMPLETION_TOKENS
    else:
        completion = DEFAULT_COMPLETION_TOKENS
    return ReplayTokens(prompt, completion, 0, False)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
