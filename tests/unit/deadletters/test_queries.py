"""DLQ listing from the time index: only what a page needs, totals from the counters."""

import json

from dlqapp.deadletters.queries import DlqFilter, local_page, merge_pages, newest_first


def summaries(*rows):
    return [
        json.dumps(
            {"request_id": rid, "key": rid, "error_class": cls, "dead_at": at, "final_error": "e", "model": None}
        ).encode()
        for rid, cls, at in rows
    ]


class Counting:
    """An iterable that remembers how many items were read."""

    def __init__(self, items):
        self.items, self.read = items, 0

    def __iter__(self):
        for item in self.items:
            self.read += 1
            yield item


def test_newest_first_merges_partitions_and_a_plain_page_reads_only_what_it_shows():
    p0 = Counting(summaries(("a", "timeout", 9), ("b", "timeout", 5), ("c", "auth_error", 1)))
    p1 = Counting(summaries(("d", "auth_error", 8), ("e", "timeout", 2)))
    page = local_page(newest_first([p0, p1]), DlqFilter(), top=2, by_class={"timeout": 3, "auth_error": 2})
    assert [i["request_id"] for i in page["items"]] == ["a", "d"]
    assert page["total"] == 5 and page["counts"] == {"timeout": 3, "auth_error": 2}
    assert p0.read + p1.read <= 4  # not the whole index


def test_a_class_filter_uses_the_class_counter_and_other_filters_walk():
    rows = summaries(("a", "timeout", 9), ("d", "auth_error", 8), ("b", "timeout", 5))
    page = local_page(
        newest_first([rows]), DlqFilter(error_class="auth_error"), top=10, by_class={"timeout": 2, "auth_error": 1}
    )
    assert [i["request_id"] for i in page["items"]] == ["d"] and page["total"] == 1
    page = local_page(newest_first([rows]), DlqFilter(since=6), top=1, by_class={})
    assert page["total"] == 2 and [i["request_id"] for i in page["items"]] == ["a"]


def test_pages_merge_newest_first_across_workers():
    one = {
        "total": 2,
        "items": [{"request_id": "a", "key": "a", "dead_at": 9}, {"request_id": "b", "key": "b", "dead_at": 5}],
        "counts": {"x": 2},
    }
    two = {"total": 1, "items": [{"request_id": "d", "key": "d", "dead_at": 8}], "counts": {"y": 1}}
    merged = merge_pages([one, two], limit=2, offset=1)
    assert [i["request_id"] for i in merged["items"]] == ["d", "b"] and merged["total"] == 3
