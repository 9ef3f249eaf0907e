"""The inference backend interface."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from dlqapp.models import Request


@dataclass(frozen=True)
class InferenceOutput:
    """What a successful call returns."""

    text: str
    model: str
    usage: dict[str, Any] = field(default_factory=dict)


class InferenceBackend(Protocol):
    """Calls a model once. Raises `InferenceError` (or anything: it is classified)."""

    name: str

    async def complete(self, request: Request, attempt: int, model: str | None = None) -> InferenceOutput:
        """Run one attempt (1-based `attempt`), on `model` when given (the fallback). Never retries internally."""
        ...

    def calls_for(self, request_id: str) -> int:
        """Calls this process has made for a request id."""
        ...

    async def close(self) -> None: ...
