"""The retry timer's scan over a real RocksDB: what it fires, and where it starts."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocksdict import Options, Rdict

from dlqapp.core.states import StoredState
from dlqapp.retries.keys import decode_parked_key, due_upper_bound, parked_key
from dlqapp.retries.scan import REFIRE_AFTER_MS, ScanStarts, next_due_after, scan_due
from dlqapp.retries.scheduler import RetryScheduler

NOW = 1_700_000_000_000


@pytest.fixture
def db(tmp_path):
    store = Rdict(str(tmp_path / "parked"), Options(raw_mode=True))
    yield store
    store.close()


def stored(doc: dict) -> StoredState:
    """A request state as the requests table holds it."""
    return StoredState.decode(json.dumps({"request_id": "r", **doc}).encode())


def timer_only_scheduler(dbs: dict, starts: ScanStarts, handover: object, *, batch: int, clock) -> Any:
    """A RetryScheduler with only what its timer side touches: the partitions' stores, the
    scan starts, the hand-over producer and the input gate (the rest is never reached)."""
    parked = SimpleNamespace(active_dbs=lambda: iter(dbs.items()), scan_starts=starts)
    gate = SimpleNamespace(handed_over=lambda keys: None, refresh=lambda: None, forget=lambda: None)
    return RetryScheduler(
        parked,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        dead_letters=None,  # type: ignore[arg-type]
        in_flight=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        handover=handover,  # type: ignore[arg-type]
        gate=gate,  # type: ignore[arg-type]
        batch=batch,
        max_payload_bytes=1000,
        clock=clock,
    )


def test_fires_due_keys_earliest_first_and_never_future_ones(db):
    for due, rid in [(NOW - 5, "b"), (NOW, "c"), (NOW - 10, "a"), (NOW + 1, "future")]:
        db.put(parked_key(due, rid), b"x")
    keys, _ = scan_due(db, NOW, start=None, fired={}, batch=100)
    assert keys == [parked_key(NOW - 10, "a"), parked_key(NOW - 5, "b"), parked_key(NOW, "c")]


def test_takes_at_most_a_batch(db):
    for i in range(10):
        db.put(parked_key(NOW - 100 + i, f"r{i}"), b"x")
    keys, start = scan_due(db, NOW, start=None, fired={}, batch=3)
    assert keys == [parked_key(NOW - 100 + i, f"r{i}") for i in range(3)]
    assert start == keys[0]


def test_skips_fired_keys_until_they_are_overdue_for_a_refire(db):
    key = parked_key(NOW - 1, "r")
    db.put(key, b"x")
    assert scan_due(db, NOW, start=None, fired={key: NOW - 10}, batch=10)[0] == []
    assert scan_due(db, NOW, start=None, fired={key: NOW - REFIRE_AFTER_MS - 1}, batch=10)[0] == [key]


def test_next_start_is_the_first_present_key_or_now(db):
    db.put(parked_key(NOW + 60_000, "later"), b"x")
    assert scan_due(db, NOW, start=None, fired={}, batch=10)[1] == due_upper_bound(NOW)
    db.put(parked_key(NOW - 7, "due"), b"x")
    assert scan_due(db, NOW, start=None, fired={}, batch=10)[1] == parked_key(NOW - 7, "due")


def test_a_start_skips_tombstones_but_a_key_parked_below_it_lowers_it(db):
    starts = ScanStarts()
    for i in range(1000):  # fired and deleted: tombstones at the head
        db.put(parked_key(NOW - 5000 + i, f"old{i}"), b"x")
        db.delete(parked_key(NOW - 5000 + i, f"old{i}"))
    keys, start = scan_due(db, NOW, start=starts.get(0, db), fired={}, batch=10)
    starts.set(0, db, start)
    assert keys == [] and starts.get(0, db) == due_upper_bound(NOW)
    late = parked_key(NOW - 9000, "parked-with-an-old-due-time")
    db.put(late, b"x")
    starts.lower_to(late)
    assert scan_due(db, NOW, start=starts.get(0, db), fired={}, batch=10)[0] == [late]


def test_a_start_belongs_to_one_store(db, tmp_path):
    starts = ScanStarts()
    starts.set(0, db, parked_key(NOW, "x"))
    other = object()
    assert starts.get(0, other) is None  # the partition's store was reopened: scan from the first key
    starts.keep_only([1])
    assert starts.get(0, db) is None


operations = st.lists(
    st.tuples(st.sampled_from(["park", "fire", "advance"]), st.integers(-50, 50)),
    max_size=60,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations)
def test_scanning_from_the_start_finds_what_a_full_scan_finds(tmp_path_factory, ops):
    """Park (at due times around now), fire-and-delete, let time pass, in any order:
    a scan from the kept start always returns what a scan from the first key returns."""
    db = Rdict(str(tmp_path_factory.mktemp("scan") / "parked"), Options(raw_mode=True))
    try:
        starts, now, serial = ScanStarts(), NOW, 0
        for op, delta in ops:
            if op == "park":
                serial += 1
                key = parked_key(now + delta, f"r{serial}")
                db.put(key, b"x")
                starts.lower_to(key)
            elif op == "advance":
                now += abs(delta)
            full, _ = scan_due(db, now, start=None, fired={}, batch=1000)
            from_start, next_start = scan_due(db, now, start=starts.get(0, db), fired={}, batch=1000)
            starts.set(0, db, next_start)
            assert from_start == full
            if op == "fire":
                for key in full:
                    db.delete(key)
    finally:
        db.close()


def test_a_parked_retry_from_before_a_replay_is_stale():
    from dlqapp.core.envelope import Envelope
    from dlqapp.retries.scheduler import superseded_by

    old_chain = Envelope("r", b"{}", 0, {}, attempts=2)
    replayed_chain = Envelope("r", b"{}", 0, {}, attempts=1, lineage={"replay_count": "1"})
    state = stored({"state": "reprocessed", "attempts": 4, "replay_count": 1})
    assert superseded_by(state, old_chain) is not None
    assert superseded_by(state, replayed_chain) is None
    assert superseded_by(stored({"state": "retry_scheduled", "attempts": 1}), old_chain) is None


def test_next_due_after_names_the_earliest_retry_not_yet_due(db):
    assert next_due_after(db, NOW) is None
    for due, rid in [(NOW - 5, "past"), (NOW, "now"), (NOW + 250, "later"), (NOW + 40, "soon")]:
        db.put(parked_key(due, rid), b"x")
    assert next_due_after(db, NOW) == NOW + 40
    assert next_due_after(db, NOW + 40) == NOW + 250
    assert next_due_after(db, NOW + 250) is None


def test_a_tick_queues_every_partitions_hand_overs_before_it_waits_for_the_broker(tmp_path):
    """One wait per tick: a broker that answers only once every partition's hints are queued
    must not hold the later partitions back (it did, one round trip per partition)."""
    import asyncio

    dbs = {p: Rdict(str(tmp_path / f"parked-{p}"), Options(raw_mode=True)) for p in range(3)}
    for p, db in dbs.items():
        db.put(parked_key(NOW - 1, f"r{p}"), b"x")

    async def run() -> list[int]:
        answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queued: list[int] = []

        class Broker:
            async def send(self, key, value, partition, *, now=False):
                queued.append(partition)
                if len(queued) == len(dbs) and not answered.done():
                    answered.set_result(None)  # answers once every hint is queued
                return answered

        scheduler = timer_only_scheduler(dbs, ScanStarts(), Broker(), batch=10, clock=lambda: NOW)
        assert await asyncio.wait_for(scheduler.hand_over_due(), 2) == 3
        return queued

    try:
        assert sorted(asyncio.run(run())) == [0, 1, 2]
    finally:
        for db in dbs.values():
            db.close()


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("park"), st.integers(0, 2), st.integers(-2_000, 5_000)),
        st.tuples(st.just("attempt"), st.integers(0, 50), st.just(0)),
        st.tuples(st.just("tick"), st.integers(0, 3), st.integers(0, 2_000)),
        st.tuples(st.just("rebalance"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_a_tick_hands_over_every_due_retry_however_the_table_changed_since_the_last(tmp_path_factory, ops):
    """Random histories of parks, attempts (deletes), ticks and rebalances against a tick
    that skips partitions it found quiet: after every tick each retry due within the lead
    has been handed over, none later, and the next due time is the earliest one left."""
    import asyncio

    root = tmp_path_factory.mktemp("quiet")
    dbs = {p: Rdict(str(root / f"parked-{p}"), Options(raw_mode=True)) for p in range(3)}
    clock = {"now": NOW}
    sent: list[bytes] = []

    class Broker:
        async def send(self, key, value, partition, *, now=False):
            sent.append(value)
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done

    starts = ScanStarts()
    scheduler = timer_only_scheduler(dbs, starts, Broker(), batch=1_000, clock=lambda: clock["now"])
    present: dict[bytes, int] = {}  # parked key -> partition

    async def history() -> None:
        for n, (op, a, b) in enumerate(ops):
            if op == "park":
                key = parked_key(clock["now"] + b, f"r{n}")
                dbs[a].put(key, b"x")
                starts.lower_to(key)  # as ParkedRetries.store does
                present[key] = a
            elif op == "attempt" and scheduler.handed_over:
                key = sorted(scheduler.handed_over)[a % len(scheduler.handed_over)]
                dbs[present.pop(key)].delete(key)
                scheduler.handed_over.pop(key)
            elif op == "rebalance":
                scheduler.forget_handed_over()
            elif op == "tick":
                for _ in range(a + 1):
                    clock["now"] += b // (a + 1)
                    sent.clear()
                    await scheduler.hand_over_due()
                    horizon = clock["now"] + scheduler.lead.ms
                    due = {k for k in present if decode_parked_key(k)[0] <= horizon}
                    assert due <= set(scheduler.handed_over), "a due retry was not handed over"
                    assert all(decode_parked_key(k)[0] <= horizon for k in sent), "handed over too early"
                    later = [d for k in present if (d := decode_parked_key(k)[0]) > horizon]
                    assert scheduler.next_due == min(later, default=None)

    try:
        asyncio.run(history())
    finally:
        for db in dbs.values():
            db.close()
