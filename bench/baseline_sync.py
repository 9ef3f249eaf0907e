"""Baseline A: the source documents' design. Poll one message, call the model, produce, commit.

python bench/baseline_sync.py --bootstrap 127.0.0.1:9092 --input T --results T --llm URL --count N
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.request

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer


def call_model(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "X-Request-ID": body["request_id"]},
    )
    with urllib.request.urlopen(request, timeout=30) as response:  # blocking, one at a time
        return json.loads(response.read())


async def run(args: argparse.Namespace) -> None:
    consumer = AIOKafkaConsumer(
        args.input,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=1,
    )
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap, acks="all")
    await consumer.start()
    await producer.start()
    try:
        done = 0
        while done < args.count:
            batch = await consumer.getmany(timeout_ms=1000, max_records=1)
            for messages in batch.values():
                for message in messages:
                    request = json.loads(message.value)
                    answer = call_model(
                        args.llm, {"request_id": request["request_id"], "model": "m", "messages": request["messages"]}
                    )
                    result = {
                        "request_id": request["request_id"],
                        "output": answer["choices"][0]["message"]["content"],
                        "completed_at": int(time.time() * 1000),
                    }
                    await producer.send_and_wait(args.results, json.dumps(result).encode(), key=message.key)
                    await consumer.commit()
                    done += 1
    finally:
        await consumer.stop()
        await producer.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("bootstrap", "input", "results", "llm", "group"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--count", type=int, required=True)
    asyncio.run(run(parser.parse_args()))
