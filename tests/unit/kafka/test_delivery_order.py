"""DeliveryOrder: records reach the agents in offset order, none skipped, each once."""

from __future__ import annotations

import random

from dlqapp.kafka.delivery_order import DeliveryOrder, Verdict

TP = ("input", 0)


def started(offset: int = 10, batch: int = 1) -> DeliveryOrder:
    order = DeliveryOrder()
    order.start(TP, offset, batch)
    return order


def test_nothing_is_delivered_before_the_partition_is_sought_in_this_assignment():
    order = DeliveryOrder()
    assert order.decide(TP, 0, batch=1) is Verdict.DROP
    order.start(TP, 0, batch=1)
    assert order.decide(TP, 0, batch=2) is Verdict.DELIVER


def test_the_expected_offset_is_delivered_and_a_repeat_is_dropped():
    order = started(10)
    assert order.decide(TP, 10, batch=2) is Verdict.DELIVER
    order.delivered(TP, 10)
    assert order.decide(TP, 10, batch=2) is Verdict.DROP
    assert order.decide(TP, 11, batch=2) is Verdict.DELIVER


def test_records_fetched_before_the_seek_are_dropped_not_rewound():
    order = started(10, batch=5)
    assert order.decide(TP, 400, batch=5) is Verdict.DROP
    assert order.decide(TP, 400, batch=6) is Verdict.REWIND


def test_a_jump_rewinds_to_the_offset_expected_and_the_rest_of_that_fetch_is_dropped():
    order = started(10)
    order.delivered(TP, 10)
    assert order.decide(TP, 500, batch=3) is Verdict.REWIND
    assert order.rewinding(TP, 500, batch=3) == 11
    assert order.decide(TP, 501, batch=3) is Verdict.DROP
    assert order.decide(TP, 11, batch=4) is Verdict.DELIVER


def test_a_jump_to_the_same_record_after_rewind_after_rewind_is_a_real_gap():
    order = started(10)
    for batch in range(3, 3 + DeliveryOrder.GAP_AFTER_REWINDS - 1):
        assert order.decide(TP, 50, batch=batch) is Verdict.REWIND
        order.rewinding(TP, 50, batch=batch)
    assert order.decide(TP, 50, batch=batch + 1) is Verdict.GAP
    order.delivered(TP, 50)
    assert order.decide(TP, 51, batch=4) is Verdict.DELIVER


def test_a_jump_to_another_record_after_a_rewind_rewinds_again():
    order = started(10)
    order.rewinding(TP, 50, batch=3)
    assert order.decide(TP, 70, batch=4) is Verdict.REWIND


def test_an_idle_partition_whose_position_is_past_the_offset_expected_is_behind():
    order = started(10)
    order.delivered(TP, 10)
    assert order.behind({TP: 11, ("input", 1): 99}) == []
    assert order.behind({TP: 40}) == [TP]


def test_revoked_partitions_deliver_nothing_until_sought_again():
    order = started(10)
    order.forget([TP])
    assert order.decide(TP, 10, batch=9) is Verdict.DROP
    order.delivered(TP, 10)  # a delivery that finished after the revocation changes nothing
    assert order.expected(TP) is None


def test_whatever_the_fetches_skip_every_offset_is_delivered_once_and_in_order():
    """A fetch stream that skips records at random: following the verdicts (seeking on a
    rewind) delivers 0..N-1 exactly once each, in order."""
    rng = random.Random(7)
    log_end = 2_000
    order = started(0)
    position, batch, delivered = 0, 1, []
    while len(delivered) < log_end:
        batch += 1
        if position == log_end:  # nothing more to fetch: the consumer is idle
            for tp in order.behind({TP: position}):
                position = order.rewinding(tp, position, batch)
            continue
        fetched = list(range(position, min(position + rng.randint(1, 200), log_end)))
        position = fetched[-1] + 1
        if rng.random() < 0.3:  # Faust dropped part of the fetch (a pause, a cancelled hand-over)
            cut = rng.randrange(len(fetched))
            fetched = fetched[:cut] + fetched[cut + rng.randint(1, 50) :]
        for offset in fetched:
            verdict = order.decide(TP, offset, batch)
            if verdict is Verdict.REWIND:
                position = order.rewinding(TP, offset, batch)
            elif verdict in (Verdict.DELIVER, Verdict.GAP):
                assert verdict is Verdict.DELIVER, f"a skip was taken for a gap at {offset}"
                order.delivered(TP, offset)
                delivered.append(offset)
    assert delivered == list(range(log_end))


def test_an_idle_tail_of_only_a_commit_marker_is_rewound_then_taken_as_a_gap():
    """Under exactly_once a partition's log ends in a transaction marker, which a consumer
    never receives: its position stays one past the last record delivered. Idle rewinds that
    keep ending there make the marker a gap; a record delivered in between starts over."""
    order = started(10)
    order.delivered(TP, 10)  # position 12: offset 11 is the marker
    for _ in range(DeliveryOrder.GAP_AFTER_REWINDS - 1):
        assert order.idle_check({TP: 12}) == [(TP, Verdict.REWIND, 11)]
    assert order.idle_check({TP: 12}) == [(TP, Verdict.GAP, 11)]
    assert order.expected(TP) == 12 and order.idle_check({TP: 12}) == []
    order.delivered(TP, 12)
    assert order.idle_check({TP: 20}) == [(TP, Verdict.REWIND, 13)]
    order.delivered(TP, 13)  # a record after all: the count starts over
    assert order.idle_check({TP: 20}) == [(TP, Verdict.REWIND, 14)]
    assert order.idle_check({TP: 21}) == [(TP, Verdict.REWIND, 14)]  # another position: not the same hole


def test_with_commit_markers_between_records_every_record_is_delivered_once_and_in_order():
    """A read_committed fetch stream never returns the markers a transactional writer
    leaves: following the verdicts delivers every record once, in order, and ends idle."""
    rng = random.Random(11)
    records, offset = [], 0
    while len(records) < 500:
        records += list(range(offset, offset + rng.randint(1, 5)))
        offset = records[-1] + 2  # one marker after each transaction
    log_end = offset - 1  # the log ends with a marker
    order = started(0)
    position, batch, delivered = 0, 1, []
    for _ in range(10_000):
        batch += 1
        fetched = [o for o in records if position <= o < position + 50]
        position = min(position + 50, log_end + 1) if not fetched else fetched[-1] + 1
        if not fetched:
            if order.expected(TP) == log_end + 1:
                break
            for tp, verdict, _ in order.idle_check({TP: log_end + 1}):
                position = order.rewinding(tp, log_end + 1, batch) if verdict is Verdict.REWIND else log_end + 1
            continue
        for record in fetched:
            verdict = order.decide(TP, record, batch)
            if verdict is Verdict.REWIND:
                position = order.rewinding(TP, record, batch)
                break
            if verdict in (Verdict.DELIVER, Verdict.GAP):
                order.delivered(TP, record)
                delivered.append(record)
    assert delivered == records and order.expected(TP) == log_end + 1
