"""Load and recovery measurement for the cluster chaos tests (tests/chaos/test_cluster.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from dlqapp.core.partitioning import owner_partition
from tests.kafka_io import request_bytes


def ids_per_partition(ids: list[str], partitions: int) -> Counter[int]:
    return Counter(owner_partition(rid, partitions) for rid in ids)


class SteadyLoad(threading.Thread):
    """Produces `ids` to `topic` at `rate` per second (acks=all) until done or stopped."""

    def __init__(self, bootstrap: str, topic: str, ids: list[str], rate: float) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.ids, self.rate = bootstrap, topic, ids, rate
        self.sent = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:  # reported by finish()
            self.error = exc

    async def _produce(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", linger_ms=5, request_timeout_ms=120_000
        )
        await producer.start()
        try:
            began = time.monotonic()
            pending = []
            for i, rid in enumerate(self.ids):
                if self._halt.is_set():
                    break
                delay = began + i / self.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                pending.append(await producer.send(self.topic, key=rid.encode(), value=request_bytes(rid)))
                self.sent = i + 1
            await asyncio.gather(*pending)
        finally:
            await producer.stop()

    def halt(self) -> None:
        """Stop producing (the ids sent so far stay sent)."""
        self._halt.set()

    def finish(self, timeout: float = 600) -> list[str]:
        """Wait until every id is sent and acknowledged; the ids sent."""
        self.join(timeout)
        assert not self.is_alive(), f"the load did not finish within {timeout}s ({self.sent} sent)"
        assert self.error is None, f"the load failed: {self.error!r}"
        return self.ids[: self.sent]


class StallMeter(threading.Thread):
    """Samples the outcome topics' end offsets per partition and keeps the longest time a
    partition with requests still to settle went without a new outcome: "time to recover".
    Start it once outcomes flow (a partition counts as stalled from the meter's start)."""

    def __init__(self, bootstrap: str, topics: tuple[str, ...], expected: Counter[int], interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topics, self.expected, self.interval = bootstrap, topics, expected, interval
        self.longest = 0.0
        self.samples = 0
        self.advanced: dict[int, float] = {}
        self.settled: dict[int, int] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        asyncio.run(self._sample())

    async def _sample(self) -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, request_timeout_ms=10_000)
        await consumer.start()
        partitions = sorted(self.expected)
        tps = [TopicPartition(t, p) for t in self.topics for p in partitions]
        last = {p: (-1, time.monotonic()) for p in partitions}
        try:
            while not self._halt.is_set():
                try:
                    offsets = await asyncio.wait_for(consumer.end_offsets(tps), timeout=5)
                except Exception:  # a broker is down: the stall goes on
                    offsets = None
                now = time.monotonic()
                if offsets is not None:
                    self.samples += 1
                    for p in partitions:
                        settled = sum(offsets[TopicPartition(t, p)] for t in self.topics)
                        seen, since = last[p]
                        self.settled[p] = settled
                        if settled != seen:
                            last[p] = (settled, now)
                            self.advanced[p] = now
                        elif settled < self.expected[p]:
                            self.longest = max(self.longest, now - since)
                await asyncio.sleep(self.interval)
        finally:
            await consumer.stop()

    def flowing_since(self, moment: float) -> bool:
        """Every partition with requests left has had a new outcome after `moment`."""
        return all(self.advanced.get(p, 0.0) > moment or self.settled.get(p, 0) >= n for p, n in self.expected.items())

    def stop(self) -> float:
        """Stop sampling; the longest stall in seconds."""
        self._halt.set()
        self.join(30)
        return round(self.longest, 1)
