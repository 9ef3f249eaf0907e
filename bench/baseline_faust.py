"""Baseline C, Faust's floor: the cheapest Faust pass-through, with none of dlqapp's guarantees.

One agent on `input`; every event starts a task (at most `--concurrency` at once) that
calls the model and produces the answer to `results` on Faust's producer, then acks the
event. No state, no dedup, no retries, no DLQ, acks in any order. On uvloop, like dlqapp.
The model is called with aiohttp's client, or with `--http dlqapp` with dlqapp's own (so the
floor can be read with the client dlqapp pays for).
What it costs per request is what any Faust application pays for consuming and
producing a record; dlqapp cannot be cheaper. Prints `ready` once it owns partitions.

    python bench/baseline_faust.py --bootstrap … --input T --results T --llm URL --group G --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable

import aiohttp
import faust
import uvloop
from chat_call import answer, answer_via_pool

from dlqapp.inference.http_pool import HttpPool


def build(args: argparse.Namespace, ready_fd: int) -> faust.App:
    app = faust.App(
        args.group,
        broker=f"kafka://{args.bootstrap}",
        store="memory://",
        datadir=tempfile.mkdtemp(prefix="baseline-faust-"),
        web_enabled=False,
        producer_linger=0.005,
        producer_acks=-1,
        broker_max_poll_records=100,
    )
    source = app.topic(args.input, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")

    @app.agent(source)
    async def pass_through(stream: faust.StreamT) -> None:
        call: Callable[[bytes], Awaitable[bytes]]
        if args.http == "dlqapp":
            call = functools.partial(answer_via_pool, HttpPool(args.llm, max_idle=args.concurrency))
        else:
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.concurrency))
            call = functools.partial(answer, session, args.llm)

        slots = asyncio.Semaphore(args.concurrency)
        handling: set[asyncio.Future[None]] = set()  # a reference to each task until it is done

        async def handle(event: faust.EventT) -> None:
            try:
                result = await call(event.value)
                await (await app.producer.send(args.results, event.key, result, event.message.partition, None, None))
            finally:
                slots.release()
                event.ack()

        async for event in stream.noack().events():
            await slots.acquire()
            task = asyncio.ensure_future(handle(event))
            handling.add(task)
            task.add_done_callback(handling.discard)

    @app.task
    async def say_ready() -> None:
        while not app.consumer.assignment():
            await asyncio.sleep(0.05)
        os.write(ready_fd, b"ready\n")

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "input", "results", "llm", "group"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--http", choices=("aiohttp", "dlqapp"), default="aiohttp", help="the model's HTTP client")
    parser.add_argument(
        "--count", type=int, default=0, help="ignored (runs until killed), for the same command line as baseline B"
    )
    options = parser.parse_args()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    ready = os.dup(1)  # Faust's worker takes over stdout (into its log): `ready` goes to the caller's pipe
    os.dup2(2, 1)
    sys.argv = [sys.argv[0], "worker", "-l", "warn", "--without-web"]
    build(options, ready).main()
