"""The tables' RocksDB options: the write-ahead log skipped when the table asks for it."""

from pathlib import Path

import pytest
from faust.stores.rocksdb import RocksDBOptions

from dlqapp.settings import Settings
from dlqapp.tables.rocksdb_memory import MEMTABLE_BUDGET, SHARED_CACHE, WITHOUT_WAL, share_memory
from dlqapp.tables.topology import rocksdb_options


class _Store:
    def __init__(self, options: RocksDBOptions) -> None:
        self.rocksdb_options = options


def _wal_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.log"))


@pytest.mark.parametrize(("without_wal", "logged"), [(0, True), (1, False)])
def test_writes_skip_the_write_ahead_log_only_when_asked(tmp_path: Path, without_wal: int, logged: bool) -> None:
    extra = {SHARED_CACHE: 1 << 20, MEMTABLE_BUDGET: 1 << 22, WITHOUT_WAL: without_wal}
    store = share_memory(_Store(RocksDBOptions(use_rocksdict=True, **extra)))
    db = store.rocksdb_options.open(tmp_path / "db")
    try:
        for n in range(100):
            db.put(b"key-%d" % n, b"value" * 20)
        assert db.get(b"key-7") == b"value" * 20
        assert (_wal_bytes(tmp_path / "db") > 0) is logged  # before the close, which flushes the memtable
    finally:
        db.close()


@pytest.mark.parametrize(("guarantee", "without_wal"), [("exactly_once", 1), ("at_least_once", 0)])
def test_only_exactly_once_tables_skip_the_log(guarantee: str, without_wal: int) -> None:
    """exactly_once rebuilds the tables at every start; at_least_once reopens them, so keeps the log."""
    options = rocksdb_options(Settings.from_env({"DLQ_PROCESSING_GUARANTEE": guarantee}))
    assert options[WITHOUT_WAL] == without_wal
