"""One HTTP client alone against the mock: `calls` POSTs to /chat/completions, `in_flight`
at a time, on uvloop as the worker runs; prints its CPU µs per call and calls/s as JSON.

    python bench/http_clients.py aiohttp|dlqapp URL CALLS IN_FLIGHT

`aiohttp` is aiohttp's client as dlqapp used it until 2026-12-06 (a session, a connector
sized to the calls in flight, a total timeout); `dlqapp` is dlqapp.inference.http_pool.
Both send the same body and headers and decode the JSON answer.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable

import aiohttp
import uvloop

from dlqapp.inference.http_pool import HttpPool

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello"}], "stream": False}).encode()
Call = Callable[[int], Awaitable[None]]


async def _drive(call: Call, calls: int, in_flight: int) -> None:
    numbers = iter(range(calls))

    async def lane() -> None:
        for number in numbers:
            await call(number)

    await asyncio.gather(*(lane() for _ in range(in_flight)))


async def with_aiohttp(url: str, calls: int, in_flight: int) -> None:
    connector = aiohttp.TCPConnector(limit=in_flight, limit_per_host=in_flight)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def call(number: int) -> None:
            headers = {"X-Request-ID": f"r{number}", "Content-Type": "application/json"}
            async with session.post(url, data=BODY, headers=headers) as response:
                json.loads(await response.read())

        await _drive(call, calls, in_flight)


async def with_dlqapp(url: str, calls: int, in_flight: int) -> None:
    pool = HttpPool(url, max_idle=in_flight)

    async def call(number: int) -> None:
        async with asyncio.timeout(60):
            response = await pool.post(BODY, [("Content-Type", "application/json"), ("X-Request-ID", f"r{number}")])
        json.loads(response.body)

    try:
        await _drive(call, calls, in_flight)
    finally:
        await pool.close()


async def measure(client: str, url: str, calls: int, in_flight: int) -> dict[str, float]:
    run = {"aiohttp": with_aiohttp, "dlqapp": with_dlqapp}[client]
    cpu, wall = time.process_time(), time.monotonic()
    await run(url, calls, in_flight)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    return {"cpu_us_per_call": cpu * 1e6 / calls, "calls_per_s": calls / wall}


if __name__ == "__main__":
    name, target, count, width = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(uvloop.run(measure(name, target, count, width))))
