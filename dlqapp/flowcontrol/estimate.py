"""A request's tokens, estimated before the call (pure).

estimate = ceil(characters of the prompt / 4) + 4 per message + the completion budget

- characters: every string content, and the `text` of content parts (images and other
  parts count nothing);
- 4 characters per token is the usual rule of thumb for English text with OpenAI's
  tokenizers; 4 tokens per message is the chat format's overhead per message;
- the completion budget is `params.max_completion_tokens` or `params.max_tokens`, else
  `DEFAULT_COMPLETION_TOKENS`, times `params.n` when more than one choice is asked for.

The estimate is charged before the call; once the response's `usage.total_tokens` is
known the difference is given back (or charged, when the estimate was low).
"""

from __future__ import annotations

import math
from typing import Any

from dlqapp.core.requests import Request
from dlqapp.core.usage import content_chars

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4
DEFAULT_COMPLETION_TOKENS = 256


def estimate_tokens(request: Request) -> int:
    """Tokens the call is expected to use: prompt plus completion budget."""
    messages = request.messages if request.messages else [{"content": request.prompt or ""}]
    chars = sum(content_chars(m.get("content")) for m in messages if isinstance(m, dict))
    return math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages) + completion_budget(request.params)


def completion_budget(params: dict[str, Any]) -> int:
    """Completion tokens the request may use."""
    budget = (
        _positive_int(params.get("max_completion_tokens"))
        or _positive_int(params.get("max_tokens"))
        or DEFAULT_COMPLETION_TOKENS
    )
    return budget * (_positive_int(params.get("n")) or 1)


def used_tokens(usage: dict[str, Any] | None) -> int | None:
    """`usage.total_tokens` (or prompt + completion) of a response, None when absent."""
    if not isinstance(usage, dict):
        return None
    total = _non_negative_int(usage.get("total_tokens"))
    if total is not None:
        return total
    prompt, completion = (
        _non_negative_int(usage.get("prompt_tokens")),
        _non_negative_int(usage.get("completion_tokens")),
    )
    return prompt + completion if prompt is not None and completion is not None else None


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _non_negative_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
