"""dlqapp.deadletters.entries: a DLQ entry's keys (by request id, by time, of an
unprocessable copy) and find_dead_letter over a real RocksDB per partition."""

from __future__ import annotations

import json
import struct

import pytest
from rocksdict import Options, Rdict

from dlqapp.core.partitioning import owner_partition
from dlqapp.deadletters.entries import find_dead_letter, owner_id, time_key, unprocessable_key
from tests.unit.deadletters.entry_helpers import T0, position

# -- keys --------------------------------------------------------------------------------


def test_an_unprocessable_key_names_its_request_class_and_position():
    pos = position("app.input", 0, 42)
    assert unprocessable_key("r-1", "invalid_request", pos) == f"r-1~invalid_request~{pos}"
    assert owner_id(unprocessable_key("r-1", "invalid_request", pos)) == "r-1"
    assert owner_id(unprocessable_key("r-1", "poison", pos)) == "r-1"


@pytest.mark.parametrize(
    "request_id",
    [
        "r-1",
        "a~b",  # an id with the separator in it
        "x~poison~000000000000",  # an id that looks like an unprocessable key itself
        "line\nbreak",
        pytest.param("ид-запроса-🙂", id="non-ascii"),
        pytest.param("r" * 10_000, id="10k-chars"),
        "~",
    ],
)
def test_the_owner_of_an_unprocessable_key_is_the_whole_request_id(request_id):
    for error_class in ("invalid_request", "poison"):
        key = unprocessable_key(request_id, error_class, position("app.input", 1, 7))
        assert owner_id(key) == request_id


@pytest.mark.parametrize(
    "key",
    [
        "r-1",
        "",
        "r-1~server_error~0123456789ab",  # not an unprocessable class
        "r-1~invalid_request~0123456789a",  # 11 hex digits
        "r-1~invalid_request~0123456789abc",  # 13
        "r-1~invalid_request~0123456789AB",  # upper-case hex is not what dlqapp writes
        "r-1~poison~0123456789ag",
        "~invalid_request~0123456789ab",  # no request id before it
        "r-1~invalid_request~0123456789ab\n~x",
    ],
)
def test_any_other_key_is_its_own_owner(key):
    assert owner_id(key) == key


def test_a_time_key_is_the_dead_at_as_eight_big_endian_bytes_then_the_key():
    key = time_key(T0, b"r-1")
    assert key[:8] == struct.pack(">Q", T0) and key[8:] == b"r-1"
    assert time_key(1, b"k") == b"\x00" * 7 + b"\x01k"
    assert time_key(-5, b"k") == time_key(0, b"k") == b"\x00" * 8 + b"k"


def test_time_keys_sort_by_time_whatever_the_request_ids():
    keys = [(T0 + 2, b"a"), (T0, b"zzzz"), (T0 + 1, b"\xff" * 300), (255, b"m"), (256, b"b")]
    ordered = sorted(time_key(at, k) for at, k in keys)
    assert [struct.unpack(">Q", k[:8])[0] for k in ordered] == [255, 256, T0, T0 + 1, T0 + 2]


# -- find_dead_letter --------------------------------------------------------------------


class Table:
    """The `dead-letters` table as find_dead_letter reads it: `get` by key, and one real
    RocksDB per partition (Faust's store) for the prefix scan."""

    def __init__(self, tmp_path, partitions: int) -> None:
        self.partitions = partitions
        self.dbs = [Rdict(str(tmp_path / f"p{p}"), Options(raw_mode=True)) for p in range(partitions)]
        self.data = self

    def _db_for_partition(self, partition: int) -> Rdict:
        return self.dbs[partition]

    def put(self, key: str, dead_at: int | None) -> None:
        """Stored where dlqapp puts it: on the partition of the key's request id."""
        entry = {"key": key} if dead_at is None else {"key": key, "dead_at": dead_at}
        self.dbs[owner_partition(owner_id(key), self.partitions)][key.encode()] = json.dumps(entry).encode()

    def get(self, key: bytes) -> bytes | None:
        for db in self.dbs:
            value = db.get(key)
            if value is not None:
                return value
        return None

    def close(self) -> None:
        for db in self.dbs:
            db.close()


@pytest.fixture
def table(tmp_path):
    made: list[Table] = []

    def make(partitions: int = 3) -> Table:
        made.append(Table(tmp_path / str(len(made)), partitions))
        return made[-1]

    yield make
    for t in made:
        t.close()


def copy_key(rid: str, error_class: str, offset: int) -> str:
    return unprocessable_key(rid, error_class, position("app.input", 0, offset))


def test_a_request_ids_own_dead_letter_is_found_first(table):
    t = table()
    t.put("r-1", T0)
    t.put(copy_key("r-1", "invalid_request", 1), T0 + 10)  # newer, but only a copy
    assert find_dead_letter(t, "r-1", t.partitions) == b"r-1"


def test_without_its_own_the_newest_unprocessable_copy_is_found(table):
    t = table()
    older, newest, middle = (
        copy_key("r-1", "invalid_request", 1),
        copy_key("r-1", "poison", 2),
        copy_key("r-1", "invalid_request", 3),
    )
    t.put(older, T0)
    t.put(newest, T0 + 20)
    t.put(middle, T0 + 10)
    assert find_dead_letter(t, "r-1", t.partitions) == newest.encode()


def test_an_unprocessable_key_is_found_only_exactly(table):
    t = table()
    key = copy_key("r-1", "poison", 1)
    t.put(key, T0)
    assert find_dead_letter(t, key, t.partitions) == key.encode()
    missing = copy_key("r-1", "poison", 2)
    t.put(copy_key(missing, "invalid_request", 3), T0 + 1)  # a copy of a copy: no stand-in for the one asked for
    assert find_dead_letter(t, missing, t.partitions) is None


def test_other_ids_that_share_the_prefix_are_not_taken(table):
    t = table(partitions=1)  # all on one partition, side by side in key order
    t.put("r-1~note", T0 + 30)  # a plain id that starts with "r-1~"
    t.put(copy_key("r-1~note", "invalid_request", 1), T0 + 40)  # a copy of that id
    assert find_dead_letter(t, "r-1", t.partitions) is None
    t.put(copy_key("r-1", "invalid_request", 2), T0)
    assert find_dead_letter(t, "r-1", t.partitions) == copy_key("r-1", "invalid_request", 2).encode()


def test_a_copy_without_a_dead_at_is_still_found(table):
    t = table()
    key = copy_key("r-1", "invalid_request", 1)
    t.put(key, None)
    assert find_dead_letter(t, "r-1", t.partitions) == key.encode()
    dated = copy_key("r-1", "invalid_request", 2)
    t.put(dated, T0)
    assert find_dead_letter(t, "r-1", t.partitions) == dated.encode()


def test_nothing_found_is_none(table):
    t = table()
    t.put("other", T0)
    assert find_dead_letter(t, "r-1", t.partitions) is None


@pytest.mark.parametrize(
    "rid", [pytest.param("r" * 10_000, id="10k-chars"), pytest.param("ид-🙂", id="non-ascii"), "a~b"]
)
def test_odd_and_very_long_ids_find_their_copies(table, rid):
    t = table(partitions=12)
    key = copy_key(rid, "invalid_request", 9)
    t.put(key, T0)
    assert find_dead_letter(t, rid, t.partitions) == key.encode()
    t.put(rid, T0 - 1)
    assert find_dead_letter(t, rid, t.partitions) == rid.encode()
