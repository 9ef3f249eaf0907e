"""The `openai` backend: one call to an OpenAI-compatible `/chat/completions`, no retries.

The retry tiers are the retries, so the client never retries by itself. Each call sends
the request id as `X-Request-ID`; the connections kept open between calls are as many as
DLQ_CONCURRENCY (dlqapp.inference.http_pool).
"""

from __future__ import annotations

from typing import Any

from dlqapp.core import compact_json
from dlqapp.core.backend import CallLog, InferenceOutput
from dlqapp.core.errors import ErrorClass, InferenceError
from dlqapp.core.requests import Request, loads_shown
from dlqapp.inference.http_pool import HttpConnectionError, HttpPool
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


def _redirect_message(status: int, headers: dict[str, str], url: str) -> str:
    """What a redirect answer says: redirects are not followed (a POST may not be sent twice)."""
    where = headers.get("location", "nowhere given")
    return (
        f"HTTP {status}: {url} redirects to {where}, and redirects are not followed; "
        "set DLQ_INFERENCE_URL to the URL it points to"
    )


class OpenAIBackend:
    """Calls an OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, a gateway, the mock)."""

    name = "openai"
    bounds_its_calls = True  # one timer per call, connecting included (HttpPool.post)

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
        self.timeout_s = timeout_ms / 1000
        self.default_model = default_model
        self._http = HttpPool(self.url, max_idle=pool_size)
        self._calls = CallLog(call_log_size)

    def calls_for(self, request_id: str) -> int:
        return self._calls.count(request_id)

    async def complete(self, request: Request, attempt: int, model: str | None = None) -> InferenceOutput:
        model = model or request.model or self.default_model
        headers = [("Content-Type", "application/json"), ("X-Request-ID", request.request_id)]
        if self.api_key:
            headers.append(("Authorization", f"Bearer {self.api_key}"))
        payload = compact_json.dumps(chat_body(request, model))
        self._calls.record(request.request_id)
        try:
            response = await self._http.post(payload, headers, timeout_s=self.timeout_s)
        except TimeoutError:
            raise InferenceError(ErrorClass.TIMEOUT, f"no answer from {self.url} within {self.timeout_s:g}s") from None
        except HttpConnectionError as exc:
            raise InferenceError(ErrorClass.CONNECTION_ERROR, f"{type(exc).__name__}: {exc}") from None
        if 300 <= response.status < 400:
            raise InferenceError(ErrorClass.UNKNOWN, _redirect_message(response.status, response.headers, self.url))
        body = self._json(response.body)
        if response.status >= 400 or response.status < 200:
            raise InferenceError.of(classify_response(response.status, response.headers, body=body))
        return parse_completion(body, model)

    @staticmethod
    def _json(raw: bytes) -> Any:
        """The body as JSON, whatever its content type (a lone surrogate in it replaced: its served
        model becomes a metric label); a body that is not JSON becomes an error message."""
        if not raw.strip():
            return None
        try:
            return loads_shown(raw)
        except ValueError:  # UnicodeDecodeError included
            return {"error": {"message": raw.decode("utf-8", "replace")[:300]}}

    async def close(self) -> None:
        await self._http.close()
