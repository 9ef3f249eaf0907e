"""dlqapp's consumer (dlqapp.kafka.faust_consumer) around rebalances: it starts handing an
assignment's records to the streams after the seek, with flow active, and only once the
rebalance has ended, so no event runs before its tables are recovered; and its idle rewinds
leave alone a partition revoked while they run."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP

from dlqapp.kafka.delivery_order import DeliveryOrder, Verdict
from dlqapp.kafka.faust_consumer import _OrderedConsumer


class FlowControl:
    def __init__(self, active: bool) -> None:
        self.active = active

    def is_active(self) -> bool:
        return self.active


def consumer(*, flowing: bool, rebalancing: bool, generation: int = 3) -> Any:
    sought: list[dict[str, int]] = []

    async def seek_all(targets: dict[str, int]) -> None:
        sought.append(dict(targets))

    fake = SimpleNamespace(
        app=SimpleNamespace(
            flow_control=FlowControl(flowing), rebalancing=rebalancing, consumer_generation_id=generation
        ),
        delivery_order=DeliveryOrder(),
        _fetch_batch=7,
        _pending_start=(generation, {"input-0": 26}),
        _seek_all=seek_all,
        sought=sought,
    )
    return fake


def start(fake: Any) -> None:
    asyncio.run(_OrderedConsumer._start_when_flowing(fake))


@pytest.mark.parametrize(
    "flowing, rebalancing",
    [(False, True), (True, True), (False, False)],
    ids=["suspended", "flow resumed while the changelogs are read", "suspended after the rebalance"],
)
def test_nothing_is_delivered_before_the_rebalance_ended_with_flow_active(flowing, rebalancing):
    fake = consumer(flowing=flowing, rebalancing=rebalancing)
    start(fake)
    assert fake.delivery_order.decide("input-0", 26, 8) is Verdict.DROP
    assert fake._pending_start is not None and fake.sought == []


def test_delivery_starts_at_the_sought_offset_once_the_rebalance_ended():
    fake = consumer(flowing=True, rebalancing=True)
    start(fake)
    fake.app.rebalancing = False  # Faust's on_rebalance_end, after the recovery's own seek
    start(fake)
    assert fake.delivery_order.decide("input-0", 26, 8) is Verdict.DELIVER
    assert fake._pending_start is None and fake.sought == [{"input-0": 26}]


def test_a_seek_of_an_older_generation_starts_nothing():
    fake = consumer(flowing=True, rebalancing=False)
    fake.app.consumer_generation_id = 4
    start(fake)
    assert fake.delivery_order.decide("input-0", 26, 8) is Verdict.DROP and fake.sought == []


def test_an_idle_rewind_skips_a_partition_revoked_while_an_earlier_one_was_rewound():
    """History seed 6017: a revocation between two rewinds of one idle check crashed the
    fetcher with a KeyError, and the worker with it."""
    first, second = TP("dlq", 1), TP("dlq", 2)
    order: DeliveryOrder[TP] = DeliveryOrder()
    for tp in (first, second):
        order.start(tp, 10, 1)
    sought: list[dict[TP, int]] = []
    gaps: list[tuple[TP, int, int]] = []

    async def positions() -> dict[TP, int]:
        return {first: 12, second: 12}  # both fetched past records never delivered

    async def call_thread(fn: Any) -> Any:
        return await fn()

    async def seek_all(targets: dict[TP, int]) -> None:
        sought.append(dict(targets))
        order.forget([second])  # a rebalance revokes the other one meanwhile

    async def add_gap(tp: TP, low: int, high: int) -> None:
        gaps.append((tp, low, high))

    fake = SimpleNamespace(
        delivery_order=order,
        _thread=SimpleNamespace(call_thread=call_thread),
        _positions=positions,
        _seek_all=seek_all,
        _add_gap=add_gap,
        read_committed=True,
    )
    fake._rewind = lambda tp, offset, batch, **seen: _OrderedConsumer._rewind(fake, tp, offset, batch, **seen)
    for _ in range(3):  # a rewind that keeps ending where it began takes the rest as a gap
        asyncio.run(_OrderedConsumer._rewind_behind(fake, 5))
    assert sought and all(list(targets) == [first] for targets in sought)
    assert gaps == [(first, 10, 11)]  # the third idle check takes the first one's tail as a gap
    assert order.rewinding(second, 12, 6) is None


class FakeCluster:
    """aiokafka's cluster metadata: a topic's partitions, once a refresh has brought them."""

    def __init__(self, known_after_refreshes: int) -> None:
        self.refreshes = 0
        self.known_after = known_after_refreshes

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return {0, 1, 2} if self.refreshes >= self.known_after else None


def metadata_consumer(cluster: FakeCluster, fail: bool = False) -> Any:
    client = SimpleNamespace(
        cluster=cluster, force_metadata_update=lambda: setattr(cluster, "refreshes", cluster.refreshes + 1)
    )
    aiokafka = SimpleNamespace(_client=client, subscription=lambda: {"app.input", "app.dlq"})

    def ensure_consumer() -> Any:
        if fail:
            raise RuntimeError("the consumer is stopping")
        return aiokafka

    async def call_thread(fn: Any) -> Any:
        return await fn()

    fake = SimpleNamespace(_thread=SimpleNamespace(_ensure_consumer=ensure_consumer, call_thread=call_thread))
    fake._refresh_if_missing = lambda: _OrderedConsumer._refresh_if_missing(fake)
    return fake


@pytest.mark.parametrize("known_after", [0, 1, 3])
def test_after_an_assignment_metadata_is_refreshed_until_every_subscribed_topic_is_known(known_after):
    """A broker restarting can answer metadata without the topics; the group's leader then
    assigns their partitions to nobody and aiokafka rejoins only once a refresh shows them
    (every 5 minutes by default): the consumer asks for one at once, and again, until it
    knows every topic it subscribes to, and asks for none once it does."""
    cluster = FakeCluster(known_after)
    fake = metadata_consumer(cluster)
    asyncio.run(_OrderedConsumer.until_topics_known(fake, every_s=0))
    assert cluster.refreshes == known_after


def test_metadata_refreshes_end_at_their_limit_or_when_the_consumer_stops():
    cluster = FakeCluster(known_after_refreshes=10**9)
    asyncio.run(_OrderedConsumer.until_topics_known(metadata_consumer(cluster), every_s=0.01, limit_s=0.05))
    assert 1 <= cluster.refreshes <= 10
    stopping = FakeCluster(known_after_refreshes=1)
    asyncio.run(_OrderedConsumer.until_topics_known(metadata_consumer(stopping, fail=True), every_s=0))
    assert stopping.refreshes == 0
