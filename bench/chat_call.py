"""The backend call the async baselines (B and C) make for one request record: through
aiohttp's client (`answer`), or through dlqapp's own (`answer_via_pool`, what dlqapp calls
the model with), so a baseline can be measured with either.

Run as scripts (`python bench/baseline_*.py`), they import it from their own folder.
"""

from __future__ import annotations

import json
import time

import aiohttp

from dlqapp.inference.http_pool import HttpPool


async def answer(session: aiohttp.ClientSession, llm_url: str, raw: bytes) -> bytes:
    """Send the request's messages to the model and return its result record (JSON bytes)."""
    request = json.loads(raw)
    body = {"model": "m", "messages": request["messages"]}
    async with session.post(llm_url, json=body, headers={"X-Request-ID": request["request_id"]}) as response:
        reply = await response.json()
    return _result(request, reply)


async def answer_via_pool(pool: HttpPool, raw: bytes) -> bytes:
    """`answer`, the call made with dlqapp's HTTP client."""
    request = json.loads(raw)
    body = json.dumps({"model": "m", "messages": request["messages"]}).encode()
    headers = [("Content-Type", "application/json"), ("X-Request-ID", request["request_id"])]
    response = await pool.post(body, headers, timeout_s=300)
    return _result(request, json.loads(response.body))


def _result(request: dict[str, str], reply: dict[str, list[dict[str, dict[str, str]]]]) -> bytes:
    result = {
        "request_id": request["request_id"],
        "output": reply["choices"][0]["message"]["content"],
        "completed_at": int(time.time() * 1000),
    }
    return json.dumps(result).encode()
