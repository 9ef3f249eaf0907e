"""The `openai` backend: one call to an OpenAI-compatible `/chat/completions`, no retries.

The retry tiers are the retries, so the client never retries by itself. Each call sends
the request id as `X-Request-ID`; the connection pool is sized to DLQ_CONCURRENCY.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from dlqapp.core.backend import CallLog, InferenceOutput
from dlqapp.core.errors import ErrorClass, InferenceError
from dlqapp.core.requests import Request
from dlqapp.inference.openai_errors import classify_response


def chat_body(request: Request, model: str) -> dict[str, Any]:
    """The JSON body for /chat/completions (`prompt` becomes one user message)."""
    messages = request.messages if request.messages else [{"role": "user", "content": request.prompt}]
    return {**request.params, "model": model, "messages": messages, "stream": False}


def parse_completion(body: Any, model: str) -> InferenceOutput:
    """Output text, served model and token usage of a completion body."""
    try:
        message = body["choices"][0]["message"]
        text = message.get("content") or ""
    except (KeyError, IndexError, TypeError, AttributeError):
        raise InferenceError(ErrorClass.UNKNOWN, "malformed completion: no choices[0].message") from None
    return InferenceOutput(text=text, model=body.get("model") or model, usage=body.get("usage") or {})


class OpenAIBackend:
    """Calls an OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, a gateway, the mock)."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str,
        timeout_ms: int,
        pool_size: int,
        default_model: str,
        call_log_size: int = 100_000,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key = api_key
        self.timeout = aiohttp.ClientTimeout(total=timeout_ms / 1000)
        self.pool_size = pool_size
        self.default_model = default_model
        self._session: aiohttp.ClientSession | None = None
        self._calls = CallLog(call_log_size)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.pool_size, limit_per_host=self.pool_size)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)
        return self._session

    def calls_for(self, request_id: str) -> int:
        return self._calls.count(request_id)

    async def complete(self, request: Request, attempt: int, model: str | None = None) -> InferenceOutput:
        model = model or request.model or self.default_model
        headers = {"X-Request-ID": request.request_id, "Content-Type": "application/json"}
        payload = json.dumps(chat_body(request, model), separators=(",", ":")).encode()
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        self._calls.record(request.request_id)
        try:
            async with self._client().post(self.url, data=payload, headers=headers) as response:
                body = await self._json(response)
                if response.status >= 400:
                    raise InferenceError.of(classify_response(response.status, response.headers, body=body))
        except TimeoutError:
            raise InferenceError(
                ErrorClass.TIMEOUT, f"no answer from {self.url} within {self.timeout.total:g}s"
            ) from None
        except aiohttp.ClientConnectionError as exc:
            raise InferenceError(ErrorClass.CONNECTION_ERROR, f"{type(exc).__name__}: {exc}") from None
        return parse_completion(body, model)

    @staticmethod
    async def _json(response: aiohttp.ClientResponse) -> Any:
        """The body as JSON, whatever its content type; a body that is not JSON becomes an error message."""
        raw = await response.read()
        if not raw.strip():
            return None  # as aiohttp's `json()` answers an empty body
        try:
            return json.loads(raw)
        except ValueError:  # UnicodeDecodeError included
            return {"error": {"message": raw.decode("utf-8", "replace")[:300]}}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
