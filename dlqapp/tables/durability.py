"""Tables whose writes belong to a stream step: `ConfirmedTable`.

A write (`table[key] = value`, `del table[key]`) goes into the partition's RocksDB at once,
as Faust's own path does, and its changelog record stays with the current stream step,
which sends it when it ends (dlqapp.tables.steps): one record per key, the last value
written, after the step's outputs and under exactly_once in the same transaction. A write
outside a step raises `OutsideStep`: no quieter path loses the guarantee.

Faust's own path for one write (its producer buffer, a task, sensors, a RocksDB write of
the changelog offset per record) cost about as much as everything else a successful request
does. The offset Faust keeps in each partition's RocksDB (where recovery resumes reading
the changelog) is written at most every `PERSIST_INTERVAL_S` per partition: an older offset
is always safe, recovery then re-reads a few records it already has.
"""

from __future__ import annotations

import logging
from time import monotonic
from typing import Any

import faust

from dlqapp.kafka.faust_tables import local_partition_db, set_persisted_offset
from dlqapp.tables.rocksdb_memory import share_memory
from dlqapp.tables.step import StepContext

log = logging.getLogger(__name__)

PERSIST_INTERVAL_S = 0.2
"""How often, at most, a table partition's changelog offset is written to its RocksDB."""


class ConfirmedTable(faust.Table):
    """A Faust table of bytes whose writes belong to the current stream step (module doc).

    Declared with `steps=` (the worker's `StepContext`), through `app.Table(..., steps=...)`."""

    def __init__(self, *args: Any, steps: StepContext, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps = steps
        self._offsets_due: dict[int, int] = {}
        self._offsets_written_at: dict[int, float] = {}

    def _new_store(self) -> Any:
        return share_memory(super()._new_store())

    def get(self, key: Any, default: Any = None) -> Any:
        """In a step, the step's partition (without Faust's sensors and key index); else Faust's read."""
        step = self.steps.current()
        db = None if step is None else local_partition_db(self, step.partition)
        if db is None:
            return super().get(key, default)
        value = db.get(key)
        return default if value is None else value

    def __setitem__(self, key: Any, value: Any) -> None:
        self._write(key, value)

    def __delitem__(self, key: Any) -> None:
        self._write(key, None)

    def pop(self, key: Any, default: Any = None) -> Any:
        value = self.get(key)
        if value is None:
            return default
        self._write(key, None)
        return value

    def _write(self, key: Any, value: bytes | None) -> None:
        step = self.steps.required(f"a write to table {self.name}")
        if type(key) is not bytes or not (value is None or type(value) is bytes):
            raise TypeError(f"table {self.name} holds bytes: got {type(key).__name__} = {type(value).__name__}")
        self.put_local(step.partition, key, value)
        step.wrote(self, key, value)

    def put_local(self, partition: int, key: bytes, value: bytes | None) -> None:
        """Write the partition's RocksDB only (its changelog record is the caller's to send)."""
        db = local_partition_db(self, partition)
        if value is None:
            db.delete(key)
        else:
            db.put(key, value)

    def persisted(self, partition: int, offset: int) -> None:
        """The changelog holds this partition's writes up to `offset`: note it in its RocksDB (throttled)."""
        if offset <= self._offsets_due.get(partition, -1):
            return
        self._offsets_due[partition] = offset
        now = monotonic()
        if now - self._offsets_written_at.get(partition, float("-inf")) < PERSIST_INTERVAL_S:
            return
        self._offsets_written_at[partition] = now
        try:
            set_persisted_offset(self, partition, offset)
        except Exception as exc:  # the partition's store closed meanwhile: an older offset is safe
            log.debug("changelog offset of %s[%s] not noted: %r", self.name, partition, exc)
