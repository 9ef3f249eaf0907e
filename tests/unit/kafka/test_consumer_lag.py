"""Consumer lag (dlqapp.kafka.faust_consumer_state.consumer_lag) against a fake Faust consumer."""

from types import SimpleNamespace
from typing import Any

from faust.types import TP

from dlqapp.kafka.delivery_order import DeliveryOrder
from dlqapp.kafka.faust_consumer_state import consumer_lag

DLQ = TP("dlq", 5)


def _app(
    high: int, *, read: int | None, committed: int | None, expected: int | None, unacked: tuple[int, ...] = ()
) -> Any:
    order: DeliveryOrder[TP] = DeliveryOrder()
    if expected is not None:
        order.start(DLQ, expected, batch=1)
    consumer = SimpleNamespace(
        assignment=lambda: {DLQ},
        highwater=lambda tp: high,
        _unacked_messages=[SimpleNamespace(tp=DLQ, offset=offset) for offset in unacked],
        _read_offset={DLQ: read},
        _committed_offset={DLQ: committed},
        delivery_order=order,
    )
    return SimpleNamespace(consumer=consumer)


def test_markers_at_a_partitions_end_are_no_lag_once_the_consumer_hands_over_past_them():
    # a commit marker (284) and an abort marker (285) after the last record (283): after a
    # restart Faust's read offset is the committed 284, and the idle check moved past both
    assert consumer_lag(_app(286, read=284, committed=284, expected=286), {"dlq"}) == [("dlq", 5, 0)]


def test_records_not_yet_handed_over_are_lag():
    assert consumer_lag(_app(286, read=284, committed=284, expected=280), {"dlq"}) == [("dlq", 5, 6)]


def test_records_handed_over_and_not_yet_acked_are_lag():
    app = _app(286, read=285, committed=270, expected=286, unacked=(278, 281))
    assert consumer_lag(app, {"dlq"}) == [("dlq", 5, 8)]


def test_before_its_first_seek_a_partition_counts_from_what_faust_read_or_committed():
    assert consumer_lag(_app(286, read=279, committed=270, expected=None), {"dlq"}) == [("dlq", 5, 6)]
    assert consumer_lag(_app(286, read=None, committed=284, expected=None), {"dlq"}) == [("dlq", 5, 2)]
    assert consumer_lag(_app(286, read=None, committed=284, expected=None), {"input"}) == []
