"""The retention sweep rests between passes over a partition instead of rereading it every tick."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from dlqapp.tables import retention
from dlqapp.tables.retention import Sweeper, SweptTable, request_last_change


@pytest.fixture
def table(monkeypatch):
    rows = {f"r{i}".encode(): json.dumps({"state": "succeeded", "updated_at": 0}).encode() for i in range(5)}
    reads: list[int] = []

    def scan_chunk(db, after, limit):
        reads.append(1)
        keys = sorted(k for k in rows if after is None or k > after)[:limit]
        return [(k, rows[k]) for k in keys]

    monkeypatch.setattr(retention, "active_partitions", lambda table: [0])
    monkeypatch.setattr(retention, "partition_db", lambda table, partition: None)
    monkeypatch.setattr(retention, "scan_chunk", scan_chunk)
    return SimpleNamespace(name="requests", rows=rows, reads=reads)


def sweeper(table, retention_ms: int, sent: list) -> Sweeper:
    async def expire(name, partition, keys):
        sent.extend(keys)

    return Sweeper([SweptTable(table, request_last_change)], retention_ms, expire)


def test_a_new_pass_waits_a_tenth_of_the_retention(table):
    sent: list = []
    sweep = sweeper(table, retention_ms=100_000, sent=sent)
    assert sweep.pass_interval_ms == 10_000
    asyncio.run(sweep.sweep(now_ms=200_000))  # 200 s after the entries changed: all expired
    assert len(sent) == 5 and len(table.reads) == 1
    asyncio.run(sweep.sweep(now_ms=205_000))  # still resting
    assert len(table.reads) == 1
    asyncio.run(sweep.sweep(now_ms=210_000))  # the next pass
    assert len(table.reads) == 2


def test_a_pass_longer_than_one_chunk_runs_chunk_after_chunk(table, monkeypatch):
    monkeypatch.setattr(retention, "CHUNK", 2)
    sweep = sweeper(table, retention_ms=100_000, sent=[])
    for now in (200_000, 200_001, 200_002):  # 2 + 2 + 1 rows: one pass, three ticks
        asyncio.run(sweep.sweep(now_ms=now))
    assert len(table.reads) == 3
    asyncio.run(sweep.sweep(now_ms=200_003))
    assert len(table.reads) == 3  # the pass is over: rest


def test_short_retention_sweeps_every_second_at_most(table):
    assert sweeper(table, retention_ms=2_000, sent=[]).pass_interval_ms == 1_000
    assert sweeper(table, retention_ms=7 * 86_400_000, sent=[]).pass_interval_ms == 3_600_000
