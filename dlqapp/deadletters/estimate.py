"""What a replay would cost: a simple prompt-token estimate of dead letters.

The estimate is the number of characters of the request's prompt text (every string
`content` of `messages`, text parts of structured content, and `prompt`) divided by 4,
rounded up: the usual rule of thumb for English text with OpenAI-style tokenizers. A
payload that is not a JSON request counts its bytes divided by 4. No tokenizer is loaded.
"""

from __future__ import annotations

import json
import math
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
