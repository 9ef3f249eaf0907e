from dlqapp.kafka.offset_watch import OffsetWatch


def test_a_skipped_offset_is_counted_per_topic_and_redeliveries_are_not():
    gaps = []
    watch = OffsetWatch(lambda topic, skipped: gaps.append((topic, skipped)))
    for offset in (0, 1, 2):
        assert watch.seen("in", 0, offset) == 0
    assert watch.seen("in", 0, 5) == 2  # 3 and 4 never handed over
    assert watch.seen("in", 1, 40) == 0  # first offset of a partition: no baseline
    assert watch.seen("in", 0, 3) == 0 and watch.seen("in", 0, 4) == 0  # a seek back re-reads them
    assert watch.seen("due", 0, 9) == 0 and watch.seen("due", 0, 11) == 1
    assert gaps == [("in", 2), ("due", 1)] and watch.gaps == 2


def test_after_a_rebalance_partitions_start_without_a_baseline():
    gaps = []
    watch = OffsetWatch(lambda topic, skipped: gaps.append(skipped))
    watch.seen("in", 0, 100)
    watch.reset()
    assert watch.seen("in", 0, 7) == 0 and watch.seen("in", 0, 8) == 0 and gaps == []


def test_holes_are_logged_at_most_once_a_minute_per_topic(caplog):
    now = [0.0]
    watch = OffsetWatch(lambda topic, skipped: None, clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="dlqapp.kafka.offset_watch"):
        for offset in range(0, 20, 2):  # a transaction marker after every record: nine holes
            watch.seen("in", 0, offset)
        now[0] = 61.0
        watch.seen("in", 0, 30)
    lines = [r.getMessage() for r in caplog.records]
    assert watch.gaps == 10 and len(lines) == 2 and "holes_since_last_line=8" in lines[1]
