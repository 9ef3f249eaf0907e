"""What Faust's consumer knows and does for the app as a whole: events handed back unacked,
consumer lag, pausing a topic. Each helper names the private member it touches;
checked against faust-streaming 0.15.3."""

from __future__ import annotations

from typing import Any


def hand_back_unacked(app: Any, event: Any) -> None:
    """Hand an event back without acking it, so its offset is never committed.

    `Consumer._unacked_messages` is what `wait_empty()` waits on during shutdown and
    rebalances; an event dlqapp gave up on (held by the breaker when the worker stops)
    must leave it, or the worker waits forever. Its offset stays uncommitted, so the
    partition's next owner handles it again.
    """
    consumer = getattr(app, "_consumer", None)
    if consumer is not None:
        consumer._unacked_messages.discard(event.message)


def consumer_lag(app: Any, topics: set[str]) -> list[tuple[str, int, int]]:
    """(topic, partition, messages not yet handled) for `topics`: the log end offset minus
    the oldest offset still being handled (read, not yet acked), or, when none is, minus
    the next offset the consumer hands over (dlqapp.kafka.delivery_order: past the commit
    and abort markers at a partition's end once its idle check took them as a gap), or,
    before the partition's first seek, the next offset to read.

    Faust keeps the offset it last handed to a stream in `Consumer._read_offset` and the
    events not yet acked in `Consumer._unacked_messages`; the committed offset trails by
    the commit interval (2.8 s), so a lag measured from it says more about that interval
    than about falling behind, and one measured from the read offset alone misses what
    waits in the streams' buffers (an outage fills them).
    """
    consumer = app.consumer
    lag: list[tuple[str, int, int]] = []
    try:
        assigned = consumer.assignment()
    except Exception:  # the consumer has not started yet
        return lag
    oldest: dict[Any, int] = {}
    for message in list(getattr(consumer, "_unacked_messages", ())):
        tp = message.tp
        if tp.topic in topics and (tp not in oldest or message.offset < oldest[tp]):
            oldest[tp] = message.offset
    order = getattr(consumer, "delivery_order", None)
    for tp in assigned:
        if tp.topic not in topics:
            continue
        try:
            high = consumer.highwater(tp)
        except Exception:  # not fetched yet
            continue
        if high is not None:
            position = oldest.get(tp)
            if position is None and order is not None:
                position = order.expected(tp)
            if position is None:
                # Faust's read offset is the last one read, or the committed one after a
                # seek; committed can pass the last record read (a commit marker after it)
                read = consumer._read_offset.get(tp)
                committed = consumer._committed_offset.get(tp) or 0
                position = max(read + 1, committed) if read is not None else committed
            lag.append((tp.topic, tp.partition, max(0, high - position)))
    return lag


async def set_topic_paused(app: Any, topic: str, paused: bool) -> None:
    """Pause (or resume) fetching every assigned partition of `topic`, at the aiokafka level.

    Not `Consumer.pause_partitions`: that edits Faust's active-partition set in place, and
    records of a paused partition already fetched in the current batch are then skipped
    without ever reaching a stream (offsets advanced, never handled until a restart).
    aiokafka's own pause drops its prefetched records and keeps the position, so nothing is
    skipped. The aiokafka consumer lives in Faust's consumer thread (`Consumer._thread`,
    `_ensure_consumer()`), so the call runs there.
    """
    from aiokafka import TopicPartition

    consumer = getattr(app, "_consumer", None)
    thread = getattr(consumer, "_thread", None)
    if thread is None:
        return

    async def apply() -> None:
        aio = thread._ensure_consumer()
        mine = [TopicPartition(tp.topic, tp.partition) for tp in aio.assignment() if tp.topic == topic]
        if paused:
            aio.pause(*mine)
        else:
            aio.resume(*mine)

    await thread.call_thread(apply)
