"""One memory budget for every table partition's RocksDB in a worker.

Faust opens one RocksDB per table partition, each with a block cache and write buffers of
its own: with 6 tables and 12 partitions that is 72 caches, and resident memory grew with
the tables (a 30-minute soak: +52 % over its last 20 minutes). Here they share one block
cache (DLQ_TABLE_CACHE_BYTES, index and filter blocks charged to it) and one write-buffer
budget (DLQ_TABLE_MEMTABLE_BUDGET_BYTES: past it, memtables are flushed early), so the
tables' memory is bounded whatever their size or partition count.

Under `exactly_once` the local RocksDB is thrown away at every start (the changelogs, which
hold committed writes only, rebuild it), so its write-ahead log protects nothing a restart
reads: `WITHOUT_WAL` skips it, one file write less per table write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import rocksdict
from faust.stores.rocksdb import RocksDBOptions

SHARED_CACHE = "dlq_shared_cache_bytes"
MEMTABLE_BUDGET = "dlq_memtable_budget_bytes"
WITHOUT_WAL = "dlq_without_wal"
_shared: dict[tuple[int, int], tuple[Any, Any]] = {}


def _budget(cache_bytes: int, memtable_bytes: int) -> tuple[Any, Any]:
    """The process's shared cache and write-buffer manager for this budget (made once)."""
    key = (cache_bytes, memtable_bytes)
    if key not in _shared:
        cache = rocksdict.Cache(cache_bytes)
        _shared[key] = (cache, rocksdict.WriteBufferManager(memtable_bytes, False))
    return _shared[key]


class SharedMemoryOptions(RocksDBOptions):
    """Faust's RocksDB options, but with the block cache and memtable budget shared by every DB."""

    def open(self, path: Path, *, read_only: bool = False) -> Any:
        """Faust's open, then writes without the write-ahead log if the table asked for it."""
        db = super().open(path, read_only=read_only)
        if self.extra_options.get(WITHOUT_WAL):
            db.set_write_options(unlogged_writes())
        return db

    def as_options(self) -> Any:
        cache, write_buffers = _budget(int(self.extra_options[SHARED_CACHE]), int(self.extra_options[MEMTABLE_BUDGET]))
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        # None (no RLIMIT_NOFILE limit, or unknown) leaves RocksDB's own default (-1: no limit);
        # rocksdict takes an int only (Faust's own as_options passes None and fails there)
        if self.max_open_files is not None:
            options.set_max_open_files(self.max_open_files)
        options.set_write_buffer_size(self.write_buffer_size)
        options.set_target_file_size_base(self.target_file_size_base)
        options.set_max_write_buffer_number(self.max_write_buffer_number)
        options.set_write_buffer_manager(write_buffers)
        table = rocksdict.BlockBasedOptions()
        table.set_bloom_filter(self.bloom_filter_size, block_based=True)
        table.set_block_cache(cache)
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        table.set_index_type(rocksdict.BlockBasedIndexType.binary_search())
        options.set_block_based_table_factory(table)
        return options


def unlogged_writes() -> Any:
    """Write options that skip RocksDB's write-ahead log (a crash loses the memtable's writes)."""
    options = rocksdict.WriteOptions()
    options.disable_wal = True  # type: ignore[method-assign,assignment]  # a property; the stub says a method
    return options


def share_memory(store: Any) -> Any:
    """Make a Faust RocksDB store (not yet opened) use the shared budget, when its table asked for it."""
    options = getattr(store, "rocksdb_options", None)
    if isinstance(options, RocksDBOptions) and options.use_rocksdict and SHARED_CACHE in options.extra_options:
        shared = SharedMemoryOptions.__new__(SharedMemoryOptions)
        shared.__dict__.update(options.__dict__)
        store.rocksdb_options = shared
    return store
