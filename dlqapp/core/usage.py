"""Tokens an attempt used, and a request's total over its attempts (pure).

An OpenAI-compatible answer reports `usage`: `prompt_tokens`, `completion_tokens` (which
include the reasoning tokens of reasoning models, `completion_tokens_details.reasoning_tokens`)
and, where the provider caches prompts, `prompt_tokens_details.cached_tokens` (part of
`prompt_tokens`, billed at the cached-input price). `Usage.from_openai` reads that shape.

A failed call reports nothing. Where the provider may have read the prompt before it failed
(a timeout, a 5xx, a content filter, the unexplained), its usage is estimated as the prompt's
tokens (`estimated_prompt_tokens`: characters / 4 + 4 per message, no completion) and marked
`estimated`; a call the provider refused before reading it (429, 401/403, 400, quota, context
length, a connection that never opened) used nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dlqapp.core.errors import ErrorClass
from dlqapp.core.requests import Request

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4

MAY_HAVE_READ_PROMPT = frozenset(
    {ErrorClass.TIMEOUT, ErrorClass.SERVER_ERROR, ErrorClass.CONTENT_FILTER, ErrorClass.UNKNOWN}
)
"""Failures after which the provider may have billed the prompt: their usage is estimated."""


@dataclass(frozen=True, slots=True)
class Usage:
    """The tokens of one attempt (or a sum of attempts). `cached` is part of `prompt`;
    `reasoning` is part of `completion`."""

    prompt: int = 0
    completion: int = 0
    cached: int = 0
    reasoning: int = 0
    estimated: bool = False
    """True when (part of) the count is dlqapp's estimate, not the provider's report."""

    @classmethod
    def from_openai(cls, usage: Mapping[str, Any] | None) -> Usage | None:
        """The provider's `usage` object, or None when it reports none (or nothing readable)."""
        if not isinstance(usage, Mapping):
            return None
        prompt = _count(usage.get("prompt_tokens"))
        completion = _count(usage.get("completion_tokens"))
        if prompt is None and completion is None:
            total = _count(usage.get("total_tokens"))
            if total is None:
                return None
            return cls(prompt=total)
        prompt_details = usage.get("prompt_tokens_details")
        completion_details = usage.get("completion_tokens_details")
        cached = _count(prompt_details.get("cached_tokens")) if isinstance(prompt_details, Mapping) else None
        reasoning = (
            _count(completion_details.get("reasoning_tokens")) if isinstance(completion_details, Mapping) else None
        )
        prompt = prompt or 0
        return cls(
            prompt=prompt,
            completion=completion or 0,
            cached=min(cached or 0, prompt),
            reasoning=reasoning or 0,
        )

    @property
    def total(self) -> int:
        return self.prompt + self.completion

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt + other.prompt,
            self.completion + other.completion,
            self.cached + other.cached,
            self.reasoning + other.reasoning,
            self.estimated or other.estimated,
        )

    def tokens(self) -> dict[str, int]:
        """The public `tokens` object: `{"prompt", "completion", "cached"}`."""
        return {"prompt": self.prompt, "completion": self.completion, "cached": self.cached}


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def content_chars(content: Any) -> int:
    """Characters of a message's content: a string, or the `text` of its parts (images count nothing)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(
            len(part["text"]) for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return 0


def estimated_prompt_tokens(request: Request) -> int:
    """The prompt's tokens by the rule of thumb: ceil(characters / 4) + 4 per message."""
    messages = request.messages if request.messages else [{"content": request.prompt or ""}]
    chars = sum(content_chars(m.get("content")) for m in messages if isinstance(m, dict))
    return math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages)


def failed_call_usage(request: Request, error_class: ErrorClass) -> Usage:
    """What a failed call that reported no usage is counted as (module doc)."""
    if error_class in MAY_HAVE_READ_PROMPT:
        return Usage(prompt=estimated_prompt_tokens(request), estimated=True)
    return Usage()


def attempt_usage(request: Request, reported: Mapping[str, Any] | None, error_class: ErrorClass | None) -> Usage:
    """One attempt's usage: the provider's report when there is one, else the estimate of a failure."""
    usage = Usage.from_openai(reported)
    if usage is not None:
        return usage
    if error_class is None:  # a success that reported nothing: count its prompt, marked
        return Usage(prompt=estimated_prompt_tokens(request), estimated=True)
    return failed_call_usage(request, error_class)
