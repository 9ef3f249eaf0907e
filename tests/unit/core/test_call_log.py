"""The per-request call log the backends keep: exact counts, bounded size."""

from dlqapp.core.backend import CallLog


def test_counts_calls_per_request_id():
    log = CallLog(size=10)
    assert [log.record("a"), log.record("a"), log.record("b")] == [1, 2, 1]
    assert (log.count("a"), log.count("b"), log.count("never")) == (2, 1, 0)


def test_forgets_the_least_recently_called_id_beyond_its_size():
    log = CallLog(size=2)
    log.record("old")
    log.record("kept")
    log.record("old")  # called again: now the newest
    log.record("new")
    assert len(log) == 2
    assert (log.count("kept"), log.count("old"), log.count("new")) == (0, 2, 1)


def test_stays_bounded_under_many_ids():
    log = CallLog(size=1000)
    for i in range(50_000):
        log.record(f"req-{i}")
    assert len(log) == 1000
    assert log.count("req-49999") == 1 and log.count("req-0") == 0
