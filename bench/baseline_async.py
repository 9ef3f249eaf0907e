"""Baseline B, the ceiling: a raw aiokafka pass-through without Faust.

Consume `input`, call the model with bounded concurrency, produce to `results`, commit
offsets once every message before them is done. No retries, no DLQ, no state. Prints
`ready` once it has joined its consumer group; stops after `--count` results.

    python bench/baseline_async.py --bootstrap … --input T --results T --llm URL --count N --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict, deque

import aiohttp
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from chat_call import answer


async def run(args: argparse.Namespace) -> None:
    consumer = AIOKafkaConsumer(
        args.input,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, acks="all", linger_ms=5)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.concurrency))
    slots = asyncio.Semaphore(args.concurrency)
    pending: dict[TopicPartition, deque] = defaultdict(deque)  # [offset, done] in arrival order
    await consumer.start()
    await producer.start()
    while not consumer.assignment():  # joined the group: say so (the bench measures from here)
        await asyncio.sleep(0.05)
    print("ready", flush=True)
    done = 0

    async def handle(message, entry) -> None:
        nonlocal done
        try:
            result = await answer(session, args.llm, message.value)
            await (await producer.send(args.results, result, key=message.key))
            entry[1] = True
            done += 1
        finally:
            slots.release()

    async def commit_done() -> None:
        offsets = {}
        for tp, queue in pending.items():
            last = None
            while queue and queue[0][1]:
                last = queue.popleft()[0]
            if last is not None:
                offsets[tp] = last + 1
        if offsets:
            await consumer.commit(offsets)

    tasks = set()
    last_commit = time.monotonic()
    try:
        while done < args.count:
            batch = await consumer.getmany(timeout_ms=100, max_records=args.concurrency)
            for tp, messages in batch.items():
                for message in messages:
                    await slots.acquire()
                    entry = [message.offset, False]
                    pending[tp].append(entry)
                    task = asyncio.create_task(handle(message, entry))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
            if time.monotonic() - last_commit > 1.0:
                await commit_done()
                last_commit = time.monotonic()
        await asyncio.gather(*tasks)
        await commit_done()
    finally:
        await consumer.stop()
        await producer.stop()
        await session.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "input", "results", "llm", "group"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--concurrency", type=int, default=64)
    asyncio.run(run(parser.parse_args()))
