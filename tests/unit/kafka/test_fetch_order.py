"""Due hints are handed over before input records fetched ahead of them (dlqapp.kafka.faust_consumer)."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any

from faust.types import TP

from dlqapp.kafka.faust_consumer_thread import FetchWaitConsumerThread

INPUT, DUE = TP("input", 0), TP("due", 0)


class FakeFetcher:
    """aiokafka's `Fetcher.fetched_records`: a poll takes partitions in the order their records
    were fetched, each until drained, up to `max_records`; with nothing to give it waits."""

    def __init__(self) -> None:
        self.records: dict[TP, list[str]] = {}
        self.arrived = asyncio.Event()
        self._closed = False
        self._subscriptions = SimpleNamespace(fetch_context=contextlib.nullcontext)

    def fetch(self, tp: TP, values: list[str]) -> None:
        self.records.setdefault(tp, []).extend(values)
        self.arrived.set()

    async def fetched_records(
        self, partitions: Any, timeout: float = 0, max_records: int | None = None
    ) -> dict[TP, list[str]]:
        while True:
            drained: dict[TP, list[str]] = {}
            budget = max_records
            for tp in list(self.records):
                if partitions and tp not in partitions:
                    continue
                take = self.records[tp][:budget] if budget is not None else self.records[tp]
                del self.records[tp][: len(take)]
                if not self.records[tp]:
                    del self.records[tp]
                drained[tp] = take
                if budget is not None:
                    budget -= len(take)
                    if budget == 0:
                        break
            if drained or not timeout:
                return drained
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), timeout)
            except TimeoutError:
                return {}
            timeout = 0.001


def thread() -> tuple[Any, Any]:
    fetcher = FakeFetcher()
    consumer = SimpleNamespace(_fetcher=fetcher, _closed=False)
    fetching = object.__new__(type("T", (FetchWaitConsumerThread,), {"first_topics": frozenset({"due"})}))
    fetching.consumer = SimpleNamespace(flow_active=True)
    return fetching, consumer


def test_a_due_hint_fetched_after_a_backlog_of_input_comes_in_the_first_poll():
    async def run() -> None:
        fetching, consumer = thread()
        consumer._fetcher.fetch(INPUT, [f"in-{i}" for i in range(500)])
        consumer._fetcher.fetch(DUE, ["hint"])
        polled = await fetching._fetch_records(consumer, {INPUT, DUE}, timeout=1.0, max_records=100)
        assert polled[DUE] == ["hint"]
        assert len(polled[INPUT]) == 99  # the rest of the poll, in order
        assert polled[INPUT][0] == "in-0"

    asyncio.run(run())


def test_a_due_hint_that_arrives_while_a_poll_waits_ends_the_wait():
    async def run() -> None:
        fetching, consumer = thread()
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, consumer._fetcher.fetch, DUE, ["hint"])
        started = loop.time()
        polled = await fetching._fetch_records(consumer, {INPUT, DUE}, timeout=1.0, max_records=100)
        assert polled == {DUE: ["hint"]}
        assert loop.time() - started < 0.5  # not the poll's whole second

    asyncio.run(run())
