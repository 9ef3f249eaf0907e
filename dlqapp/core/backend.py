"""The inference backend interface."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

from dlqapp.core.requests import Request


@dataclass(frozen=True)
class InferenceOutput:
    """What a successful call returns."""

    text: str
    model: str
    usage: dict[str, Any] = field(default_factory=dict)


class CallLog:
    """How many calls were made per request id, for the most recent `size` request ids.

    Bounded, so a worker that has seen millions of requests holds only the newest
    counts (the oldest id is forgotten first).
    """

    def __init__(self, size: int = 100_000) -> None:
        self.size = size
        self._counts: OrderedDict[str, int] = OrderedDict()

    def record(self, request_id: str) -> int:
        """Count one more call for `request_id`; returns its count."""
        count = self._counts.pop(request_id, 0) + 1
        self._counts[request_id] = count
        if len(self._counts) > self.size:
            self._counts.popitem(last=False)
        return count

    def count(self, request_id: str) -> int:
        return self._counts.get(request_id, 0)

    def __len__(self) -> int:
        return len(self._counts)


class InferenceBackend(Protocol):
    """Calls a model once. Raises `InferenceError` (or anything: it is classified)."""

    name: str
    bounds_its_calls: bool
    """True when `complete` itself ends a call that outlasts DLQ_INFERENCE_TIMEOUT (with
    TimeoutError or a timeout InferenceError): the caller then adds no timeout of its own."""

    async def complete(self, request: Request, attempt: int, model: str | None = None) -> InferenceOutput:
        """Run one attempt (1-based `attempt`), on `model` when given (the fallback). Never retries internally."""
        ...

    def calls_for(self, request_id: str) -> int:
        """Calls this process has made for a request id (0 once it left the call log)."""
        ...

    async def close(self) -> None: ...
