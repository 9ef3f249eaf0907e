"""The backend call the async baselines (B and C) make for one request record.

Run as scripts (`python bench/baseline_*.py`), they import it from their own folder.
"""

from __future__ import annotations

import json
import time

import aiohttp


async def answer(session: aiohttp.ClientSession, llm_url: str, raw: bytes) -> bytes:
    """Send the request's messages to the model and return its result record (JSON bytes)."""
    request = json.loads(raw)
    body = {"model": "m", "messages": request["messages"]}
    async with session.post(llm_url, json=body, headers={"X-Request-ID": request["request_id"]}) as response:
        reply = await response.json()
    result = {
        "request_id": request["request_id"],
        "output": reply["choices"][0]["message"]["content"],
        "completed_at": int(time.time() * 1000),
    }
    return json.dumps(result).encode()
