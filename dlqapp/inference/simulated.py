"""The default in-process backend: seeded random outcomes, or a deterministic script.

A request whose `metadata.simulate` is `{"fail_times": N, "error": "<class>",
"retry_after": S}` fails its first N attempts with that class (and retry-after, in
seconds), then succeeds; replays continue the count. `{"crash": true}` ends the worker
process on the spot, like a crash in native code (for testing the crash-loop guard).
Other requests succeed with probability `success_rate`; failures follow a fixed mix of
timeouts, server errors, rate limits and invalid requests.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

from dlqapp.core.backend import CallLog, InferenceOutput
from dlqapp.core.errors import ErrorClass, InferenceError
from dlqapp.core.requests import Request

CRASH_EXIT_CODE = 134

FAILURE_MIX: tuple[tuple[ErrorClass, float], ...] = (
    (ErrorClass.TIMEOUT, 0.3),
    (ErrorClass.SERVER_ERROR, 0.4),
    (ErrorClass.RATE_LIMITED, 0.2),
    (ErrorClass.INVALID_REQUEST, 0.1),
)


class SimulatedBackend:
    """Simulated model calls with configurable latency, success rate and seed."""

    name = "simulated"
    bounds_its_calls = False

    def __init__(
        self,
        success_rate: float = 0.8,
        *,
        latency_ms: int = 20,
        jitter_ms: int = 10,
        seed: int | None = None,
        default_model: str = "sim-small",
        call_log_size: int = 100_000,
    ) -> None:
        self.success_rate = success_rate
        self.latency_ms = latency_ms
        self.jitter_ms = jitter_ms
        self.default_model = default_model
        self._rng = random.Random(seed)
        self._calls = CallLog(call_log_size)

    def calls_for(self, request_id: str) -> int:
        return self._calls.count(request_id)

    async def complete(self, request: Request, attempt: int, model: str | None = None) -> InferenceOutput:
        calls = self._calls.record(request.request_id)
        await asyncio.sleep(self._latency_s())
        directive = request.metadata.get("simulate")
        if isinstance(directive, dict) and directive.get("crash") is True:
            os._exit(CRASH_EXIT_CODE)
        if isinstance(directive, dict):
            # Count this process's calls too, so a replayed request continues the plan
            # (fails its first N attempts in all) instead of starting it over.
            self._follow(directive, max(attempt, calls))
        elif self._rng.random() >= self.success_rate:
            self._fail_randomly()
        return self._answer(request, model)

    def _latency_s(self) -> float:
        jitter = (self._rng.random() * 2 - 1) * self.jitter_ms
        return max(0.0, self.latency_ms + jitter) / 1000

    @staticmethod
    def _follow(directive: dict[str, Any], attempt: int) -> None:
        fail_times = int(directive.get("fail_times", 0))
        if attempt <= fail_times:
            try:
                error_class = ErrorClass(directive.get("error", "server_error"))
            except ValueError:
                error_class = ErrorClass.UNKNOWN
            retry_after = directive.get("retry_after")
            retry_after_ms = int(float(retry_after) * 1000) if retry_after is not None else None
            raise InferenceError(
                error_class,
                f"simulated {error_class.value} (attempt {attempt} of {fail_times} planned failures)",
                retry_after_ms,
            )

    def _fail_randomly(self) -> None:
        classes, weights = zip(*FAILURE_MIX, strict=True)
        error_class = self._rng.choices(classes, weights)[0]
        retry_after_ms = int(self._rng.uniform(0.5, 2.0) * 1000) if error_class is ErrorClass.RATE_LIMITED else None
        raise InferenceError(error_class, f"simulated {error_class.value}", retry_after_ms)

    def _answer(self, request: Request, model: str | None) -> InferenceOutput:
        model = model or request.model or self.default_model
        if request.messages:
            last = request.messages[-1].get("content")
            prompt = last if isinstance(last, str) else "(structured content)"
        else:
            prompt = request.prompt or ""
        text = f"[{model}] simulated answer to: {prompt[:200]}"
        usage = {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split())}
        return InferenceOutput(text=text, model=model, usage=usage)

    async def close(self) -> None:
        return None
