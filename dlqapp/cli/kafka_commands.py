"""Commands that talk to Kafka itself: synthetic requests, partition growth, the ACLs a deployment needs."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

from faust.cli import option

from dlqapp.cli.base import EXIT_UNREACHABLE, EXIT_USAGE, JSON, command, emit, fail, progress
from dlqapp.core.clock import now_ms
from dlqapp.settings import Settings


@command(
    option("--count", type=int, default=100, show_default=True, help="How many requests."),
    option("--rate", type=float, default=None, help="At most this many per second (default: as fast as possible)."),
    option(
        "--fail-share",
        type=float,
        default=0.0,
        help="Share of requests told to fail every attempt (they reach the DLQ).",
    ),
    option("--invalid-share", type=float, default=0.0, help="Share of malformed payloads."),
    option("--prefix", default="gen", help="Request id prefix."),
    JSON,
)
async def generate(
    self: Any, count: int, rate: float | None, fail_share: float, invalid_share: float, prefix: str, as_json: bool
) -> None:
    """Produce synthetic requests to the input topic."""
    settings: Settings = self.app.dlq_settings
    from aiokafka import AIOKafkaProducer

    if count < 1 or (rate is not None and rate <= 0):
        fail("--count and --rate must be positive", EXIT_USAGE)
    if not (0 <= fail_share <= 1 and 0 <= invalid_share <= 1 and fail_share + invalid_share <= 1):
        fail("--fail-share and --invalid-share are shares: each from 0 to 1, together at most 1", EXIT_USAGE)
    producer = AIOKafkaProducer(**settings.kafka_client(acks="all", linger_ms=5))
    try:
        await producer.start()
    except Exception as exc:
        fail(
            f"cannot reach Kafka at {settings.kafka_bootstrap} ({exc}); "
            "set DLQ_KAFKA_BOOTSTRAP and the DLQ_KAFKA_* security settings",
            EXIT_UNREACHABLE,
        )
    if settings.input not in (await producer.client.fetch_all_metadata()).topics():
        await producer.stop()
        fail(
            f"topic {settings.input} does not exist on Kafka at {settings.kafka_bootstrap}: "
            "start a worker first (it creates its topics), or check DLQ_TOPIC_PREFIX",
            EXIT_USAGE,
        )
    run_id = f"{prefix}-{now_ms()}"
    started = time.monotonic()
    pending = []
    try:
        for n in range(count):
            if rate:
                delay = started + n / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            key, value = synthetic_request(f"{run_id}-{n}", fail_share, invalid_share)
            pending.append(await producer.send(settings.input, value=value, key=key))
            if not as_json and (n + 1) % max(1, count // 50) == 0:
                progress(n + 1, count, "generating")
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    elapsed = time.monotonic() - started
    emit(
        {"produced": count, "topic": settings.input, "seconds": round(elapsed, 3), "prefix": run_id},
        as_json,
        f"produced {count} requests to {settings.input} in {elapsed:.1f}s (ids {run_id}-*)",
    )


@command(
    option("--to", "to", type=int, required=True, help="The partition count to grow to (more than DLQ_PARTITIONS)."),
    JSON,
)
async def grow_partitions(self: Any, to: int, as_json: bool) -> None:
    """Move a stopped deployment to more partitions, state included (stop every worker first)."""
    settings: Settings = self.app.dlq_settings
    from aiokafka.errors import KafkaError

    from dlqapp.maintenance.grow import GrowRefused, grow

    try:
        report = await grow(settings, to)
    except GrowRefused as exc:
        fail(str(exc), EXIT_USAGE)
    except KafkaError as exc:
        fail(f"Kafka at {settings.kafka_bootstrap}: {exc!r}; set DLQ_KAFKA_BOOTSTRAP", EXIT_UNREACHABLE)
    data = {
        "partitions_before": report.partitions_before,
        "partitions_after": report.partitions_after,
        "topics_grown": report.topics_grown,
        "entries_moved": dict(report.entries_moved),
        "records_moved": dict(report.records_moved),
    }
    human = (
        f"grew {len(report.topics_grown)} topics from {report.partitions_before} "
        f"to {report.partitions_after} partitions; "
        f"moved {sum(report.entries_moved.values())} table entries "
        f"and {sum(report.records_moved.values())} unconsumed records. "
        f"Start the workers with DLQ_PARTITIONS={report.partitions_after}."
    )
    emit(data, as_json, human)


@command(option("--principal", required=True, help="Who the ACLs are for, as Kafka names principals: User:NAME."), JSON)
async def acls(self: Any, principal: str, as_json: bool) -> None:
    """Print the ACLs this deployment needs, one kafka-acls argument line per resource."""
    from dlqapp.kafka.acls import kafka_acls_lines, required

    if ":" not in principal or not principal.split(":", 1)[1]:
        fail(f"--principal {principal!r} is not a Kafka principal such as User:dlqapp", EXIT_USAGE)
    grants = required(self.app.dlq_settings)
    data = [
        {
            "resource": g.resource,
            "name": g.name,
            "pattern": "prefixed" if g.prefixed else "literal",
            "operations": [op.name for op in g.operations],
            "optional": g.optional,
        }
        for g in grants
    ]
    emit(data, as_json, "\n".join(kafka_acls_lines(grants, principal)))


def synthetic_request(request_id: str, fail_share: float, invalid_share: float) -> tuple[bytes | None, bytes]:
    """(key, value) of one synthetic request."""
    roll = random.random()
    if roll < invalid_share:
        return None, random.choice([b"{not json", b'{"prompt": "no id"}', b"\xff\xfe", b"[]"])
    body: dict[str, Any] = {
        "request_id": request_id,
        "model": random.choice(["sim-small", "sim-large"]),
        "messages": [{"role": "user", "content": f"Summarise document {request_id}"}],
        "metadata": {"source": "generate"},
    }
    if roll < invalid_share + fail_share:
        body["metadata"]["simulate"] = {
            "fail_times": 99,
            "error": random.choice(["server_error", "timeout", "auth_error"]),
        }
    return request_id.encode(), json.dumps(body).encode()
