"""Faust's own metrics (`faust_*` on `/metrics`), counted at the cost of an addition per event.

Faust calls its monitor several times for every record (in, stream in, stream out, out,
each send, each table read and write). Its Prometheus sensor updates labelled Prometheus
children there, each behind a lock, on top of the default monitor's timings: together
about a seventh of the CPU a successful request cost (bench/results/profiles/). This
monitor counts in plain integers and hands them to Prometheus when it scrapes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from faust.sensors.monitor import Monitor
from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

PREFIX = "faust"


class CountingMonitor(Monitor):
    """Faust's default monitor, whose per-record hooks only count (no timings, no per-stream names)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sent_errors_by_topic: Counter[str] = Counter()

    def on_message_in(self, tp: Any, offset: int, message: Any) -> None:
        self.messages_received_total += 1
        self.messages_active += 1
        self.messages_received_by_topic[tp.topic] += 1
        self.tp_read_offsets[tp] = offset

    def on_stream_event_in(self, tp: Any, offset: int, stream: Any, event: Any) -> dict | None:
        self.events_total += 1
        self.events_active += 1
        self.stream_inbound_time[tp] = self.time()  # Faust's slow-stream check reads it
        return None

    def on_stream_event_out(self, tp: Any, offset: int, stream: Any, event: Any, state: dict | None = None) -> None:
        self.events_active -= 1

    def on_message_out(self, tp: Any, offset: int, message: Any) -> None:
        self.messages_active -= 1

    def on_table_get(self, table: Any, key: Any) -> None:
        pass

    def on_table_set(self, table: Any, key: Any, value: Any) -> None:
        pass

    def on_table_del(self, table: Any, key: Any) -> None:
        pass

    def on_send_initiated(self, producer: Any, topic: str, message: Any, keysize: int, valsize: int) -> Any:
        self.messages_sent += 1
        self.messages_sent_by_topic[topic] += 1
        return None

    def on_send_completed(self, producer: Any, state: Any, metadata: Any) -> None:
        pass


class FaustCollector(Collector):
    """`faust_*` metrics read from the monitor at scrape time."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Any]:
        m = self.monitor
        yield _counter("messages_received", "Records handed to the streams.", m.messages_received_total)
        yield _gauge("active_messages", "Records handed to the streams and not yet acked.", m.messages_active)
        per_topic = CounterMetricFamily(
            f"{PREFIX}_messages_received_per_topic", "Records handed to the streams, by topic.", labels=["topic"]
        )
        for topic, count in sorted(m.messages_received_by_topic.items()):
            per_topic.add_metric([topic], count)
        yield per_topic
        yield _offsets(
            "messages_received_per_topics_partition",
            "Offset of the last record read, by topic and partition.",
            m.tp_read_offsets,
        )
        yield _counter("total_events", "Events the streams took.", m.events_total)
        yield _gauge("total_active_events", "Events the streams took and have not finished.", m.events_active)
        yield _counter(
            "total_sent_messages",
            "Records sent through Faust's topics (dlqapp sends results and table changes on the producer directly).",
            m.messages_sent,
        )
        yield _counter("total_error_messages_sent", "Sends through Faust's topics that failed.", m.send_errors)
        yield _counter("total_rebalances", "Rebalances this worker took part in.", m.rebalances or 0)
        yield _offsets("topic_partition_end_offset", "Log end offset, by topic and partition.", m.tp_end_offsets)
        yield _offsets(
            "topic_partition_offset_commited", "Committed offset, by topic and partition.", m.tp_committed_offsets
        )


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}_{name}", documentation, value=value)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", documentation, value=value)


def _offsets(name: str, documentation: str, offsets: Any) -> GaugeMetricFamily:
    family = GaugeMetricFamily(f"{PREFIX}_{name}", documentation, labels=["topic", "partition"])
    for tp, offset in sorted(offsets.items()):
        family.add_metric([tp.topic, str(tp.partition)], offset)
    return family


def install_counting_monitor(app: Any) -> CountingMonitor:
    """Make a CountingMonitor the app's monitor and export it (call before the app starts)."""
    monitor = CountingMonitor()
    app.monitor = monitor
    REGISTRY.register(FaustCollector(monitor))
    return monitor
