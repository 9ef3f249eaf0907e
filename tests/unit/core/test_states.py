"""dlqapp.core.states: each request's stored state, its bounded history, and the counters
a state change moves (what `GET /requests/<id>/` and `/dlq/stats/` report)."""

from __future__ import annotations

import copy
import json
from collections import Counter

import pytest

from dlqapp.core import states as typed_states
from dlqapp.core.envelope import HISTORY_LIMIT
from dlqapp.core.states import (
    DEAD_LETTERED,
    DISCARDED,
    IN_FLIGHT,
    REPROCESSED,
    RETRY_SCHEDULED,
    SUCCEEDED,
    RequestState,
    StoredState,
)

T0 = 1_700_000_000_000


def typed(doc: dict | None) -> StoredState | None:
    """A stored state (its JSON) decoded as the worker reads it."""
    return None if doc is None else StoredState.decode(json.dumps(doc).encode())


def stored(record: StoredState) -> dict:
    """What the worker writes to the requests table for `record` (its JSON)."""
    return json.loads(record.encode())


class states:
    """dlqapp.core.states seen through the stored JSON (what `GET /requests/<id>/` shows):
    every call decodes its input and encodes its output, so the codec is tested with it."""

    SETTLED_FOR_DEDUP = typed_states.SETTLED_FOR_DEDUP

    @staticmethod
    def transition(previous: dict | None, *args, **detail) -> dict:
        return stored(typed_states.transition(typed(previous), *args, **detail))

    @staticmethod
    def count_duplicate(previous: dict, *args) -> dict:
        return stored(typed_states.count_duplicate(typed(previous), *args))

    @staticmethod
    def counted(previous: dict | None, new: dict) -> list[str]:
        return typed_states.counted(typed(previous), typed(new))

    @staticmethod
    def dump(doc: dict) -> bytes:
        return typed(doc).encode()

    @staticmethod
    def load(blob: bytes | None) -> dict | None:
        record = StoredState.decode(blob)
        return None if record is None else stored(record)


def run(request_id: str, *steps: tuple[RequestState, dict]) -> tuple[dict, Counter]:
    """Apply `steps` (state, detail) from nothing, one ms apart, as `RequestStore.set_state`
    does: the final record and every counter moved on the way."""
    record = None
    counters: Counter = Counter()
    for n, (state, detail) in enumerate(steps):
        new = states.transition(record, request_id, state, T0 + n, **detail)
        counters.update(states.counted(record, new))
        record = new
    assert record is not None
    return record, counters


# -- the stored values ---------------------------------------------------------------


def test_states_are_stored_as_their_public_names():
    assert [s.value for s in RequestState] == [
        "in_flight",
        "retry_scheduled",
        "succeeded",
        "dead_lettered",
        "reprocessed",
        "discarded",
    ]
    assert tuple(RequestState) == (IN_FLIGHT, RETRY_SCHEDULED, SUCCEEDED, DEAD_LETTERED, REPROCESSED, DISCARDED)
    assert RequestState("dead_lettered") is DEAD_LETTERED


def test_only_a_success_or_a_parked_retry_makes_a_new_copy_a_duplicate():
    assert SUCCEEDED in states.SETTLED_FOR_DEDUP and RETRY_SCHEDULED in states.SETTLED_FOR_DEDUP
    for state in (IN_FLIGHT, DEAD_LETTERED, REPROCESSED, DISCARDED):
        assert state not in states.SETTLED_FOR_DEDUP
    # the stored string is found as well as the enum member (records are read back from JSON)
    assert "succeeded" in states.SETTLED_FOR_DEDUP and "dead_lettered" not in states.SETTLED_FOR_DEDUP


def test_dump_is_compact_json_and_load_reads_it_back():
    record = states.transition(None, "r-1", RETRY_SCHEDULED, T0, tier="retry-1s", attempt=1)
    blob = states.dump(record)
    assert b" " not in blob
    assert b'"state":"retry_scheduled"' in blob
    loaded = states.load(blob)
    assert loaded == record
    assert loaded["state"] == RETRY_SCHEDULED and loaded["state"] in states.SETTLED_FOR_DEDUP


@pytest.mark.parametrize("blob", [None, b""])
def test_no_stored_record_loads_as_none(blob):
    assert states.load(blob) is None


@pytest.mark.parametrize(
    "request_id",
    [
        pytest.param("r" * 10_000, id="10k-chars"),
        pytest.param("ид-запроса-🙂", id="non-ascii"),
        pytest.param('quote"back\\slash\nnewline', id="json-escapes"),
        pytest.param("a~invalid_request~0123456789ab", id="unprocessable-key-shape"),
    ],
)
def test_odd_and_very_long_ids_survive_a_dump_and_load(request_id):
    record = states.transition(None, request_id, DEAD_LETTERED, T0, error_class="auth_error", dlq_key=request_id)
    loaded = states.load(states.dump(record))
    assert loaded["request_id"] == request_id and loaded["dlq_key"] == request_id  # stored whole, never cut


# -- transition ------------------------------------------------------------------------


def test_a_first_transition_makes_a_new_record():
    record = states.transition(None, "r-1", RETRY_SCHEDULED, T0, tier="retry-1s", error_class="server_error")
    assert record == {
        "request_id": "r-1",
        "first_seen": T0,
        "duplicates": 0,
        "state": "retry_scheduled",
        "updated_at": T0,
        "tier": "retry-1s",
        "error_class": "server_error",
        "history": [{"at": T0, "state": "retry_scheduled", "tier": "retry-1s", "error_class": "server_error"}],
    }
    assert "succeeded_once" not in record


def test_a_later_transition_keeps_first_seen_and_duplicates_and_appends_history():
    first = states.transition(None, "r-1", RETRY_SCHEDULED, T0, tier="retry-1s")
    first = states.count_duplicate(first, T0 + 5, "input")
    second = states.transition(first, "r-1", DEAD_LETTERED, T0 + 1000, error_class="auth_error", final_error="401")
    assert second["first_seen"] == T0 and second["duplicates"] == 1
    assert second["state"] == DEAD_LETTERED and second["updated_at"] == T0 + 1000
    assert second["error_class"] == "auth_error" and second["final_error"] == "401"
    assert [(h["at"], h["state"]) for h in second["history"]] == [
        (T0, "retry_scheduled"),
        (T0 + 5, "duplicate_skipped"),
        (T0 + 1000, "dead_lettered"),
    ]
    assert second["history"][-1] == {
        "at": T0 + 1000,
        "state": "dead_lettered",
        "error_class": "auth_error",
        "final_error": "401",
    }


def test_the_previous_record_is_left_as_it_was():
    previous = states.transition(None, "r-1", RETRY_SCHEDULED, T0, tier="retry-1s")
    before = copy.deepcopy(previous)
    states.transition(previous, "r-1", SUCCEEDED, T0 + 1, attempts=2)
    states.count_duplicate(previous, T0 + 2, "input")
    assert previous == before


def test_a_later_detail_replaces_the_earlier_value():
    first = states.transition(None, "r-1", RETRY_SCHEDULED, T0, tier="retry-1s", error_class="server_error")
    second = states.transition(first, "r-1", RETRY_SCHEDULED, T0 + 1, tier="retry-10s", error_class="timeout")
    assert second["tier"] == "retry-10s" and second["error_class"] == "timeout"
    assert [h["tier"] for h in second["history"]] == ["retry-1s", "retry-10s"]


def test_a_history_detail_cannot_replace_the_history():
    first = states.transition(None, "r-1", IN_FLIGHT, T0)
    second = states.transition(first, "r-1", SUCCEEDED, T0 + 1, history=["forged"])
    assert second["history"] == [{"at": T0, "state": "in_flight"}, {"at": T0 + 1, "state": "succeeded"}]


def test_an_attempt_log_is_kept_on_the_record_but_not_repeated_in_history():
    log = [{"attempt": 1, "error_class": "timeout"}, {"attempt": 2, "error_class": None}]
    record = states.transition(None, "r-1", SUCCEEDED, T0, attempt_log=log, attempts=2)
    assert record["attempt_log"] == log
    assert record["history"] == [{"at": T0, "state": "succeeded", "attempts": 2}]


def test_history_keeps_only_the_newest_entries():
    record = None
    total = HISTORY_LIMIT + 13
    for n in range(total):
        record = states.transition(record, "r-1", RETRY_SCHEDULED, T0 + n, attempt=n)
    assert len(record["history"]) == HISTORY_LIMIT
    assert record["history"][0]["attempt"] == total - HISTORY_LIMIT
    assert record["history"][-1] == {"at": T0 + total - 1, "state": "retry_scheduled", "attempt": total - 1}
    assert record["first_seen"] == T0  # the record remembers its start even when history forgot it


def test_a_success_is_remembered_through_a_replay():
    record, _ = run(
        "r-1", (DEAD_LETTERED, {"error_class": "auth_error"}), (REPROCESSED, {}), (SUCCEEDED, {}), (REPROCESSED, {})
    )
    assert record["state"] == REPROCESSED and record["succeeded_once"] is True
    never, _ = run("r-2", (RETRY_SCHEDULED, {"tier": "retry-1s"}), (DEAD_LETTERED, {"error_class": "server_error"}))
    assert "succeeded_once" not in never


# -- count_duplicate -------------------------------------------------------------------


def test_a_duplicate_is_counted_without_changing_the_state():
    record = states.transition(None, "r-1", SUCCEEDED, T0)
    once = states.count_duplicate(record, T0 + 50, "retry-1s")
    twice = states.count_duplicate(once, T0 + 60, "input")
    assert twice["duplicates"] == 2
    assert twice["state"] == SUCCEEDED and twice["updated_at"] == T0  # a skipped copy is not a change of state
    assert twice["history"][1:] == [
        {"at": T0 + 50, "state": "duplicate_skipped", "source": "retry-1s"},
        {"at": T0 + 60, "state": "duplicate_skipped", "source": "input"},
    ]


def test_a_record_without_a_duplicate_count_starts_at_one():
    assert states.count_duplicate({"state": "succeeded"}, T0, "input")["duplicates"] == 1
    assert states.count_duplicate({"state": "succeeded"}, T0, "input")["history"] == [
        {"at": T0, "state": "duplicate_skipped", "source": "input"}
    ]


def test_duplicates_are_bounded_in_history_but_all_counted():
    record = states.transition(None, "r-1", SUCCEEDED, T0)
    for n in range(HISTORY_LIMIT + 5):
        record = states.count_duplicate(record, T0 + 1 + n, "input")
    assert record["duplicates"] == HISTORY_LIMIT + 5
    assert len(record["history"]) == HISTORY_LIMIT
    assert all(h["state"] == "duplicate_skipped" for h in record["history"])  # the oldest (the success) dropped first


# -- counted ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "state, detail, expected",
    [
        (IN_FLIGHT, {}, ["received"]),
        (SUCCEEDED, {}, ["received", "succeeded"]),
        (RETRY_SCHEDULED, {"tier": "retry-10s"}, ["received", "retried|retry-10s"]),
        (RETRY_SCHEDULED, {}, ["received", "retried|?"]),
        (DEAD_LETTERED, {"error_class": "content_filter"}, ["received", "dead_lettered|content_filter"]),
        (DEAD_LETTERED, {}, ["received", "dead_lettered|unknown"]),
        (REPROCESSED, {}, []),  # a replay is not a request received
        (DISCARDED, {}, ["received"]),
    ],
)
def test_a_new_id_counts_received_and_what_its_first_state_moves(state, detail, expected):
    assert states.counted(None, states.transition(None, "r", state, T0, **detail)) == expected


@pytest.mark.parametrize(
    "state, detail, expected",
    [
        (IN_FLIGHT, {}, []),
        (SUCCEEDED, {}, ["succeeded"]),
        (RETRY_SCHEDULED, {"tier": "retry-1m"}, ["retried|retry-1m"]),
        (DEAD_LETTERED, {"error_class": "timeout"}, ["dead_lettered|timeout"]),
        (REPROCESSED, {}, []),
        (DISCARDED, {}, []),
    ],
)
def test_a_known_id_never_counts_received_again(state, detail, expected):
    previous = states.transition(None, "r", RETRY_SCHEDULED, T0, tier="retry-1s")
    assert states.counted(previous, states.transition(previous, "r", state, T0 + 1, **detail)) == expected


def test_a_second_success_is_not_counted():
    previous = states.transition(None, "r", SUCCEEDED, T0)
    assert states.counted(previous, states.transition(previous, "r", SUCCEEDED, T0 + 1)) == []


def test_a_retry_to_a_tier_already_used_counts_again():
    previous = states.transition(None, "r", RETRY_SCHEDULED, T0, tier="retry-1s")
    assert states.counted(previous, states.transition(previous, "r", RETRY_SCHEDULED, T0 + 1, tier="retry-1s")) == [
        "retried|retry-1s"
    ]


def test_a_whole_life_moves_each_counter_once():
    record, counters = run(
        "r-1",
        (IN_FLIGHT, {}),
        (RETRY_SCHEDULED, {"tier": "retry-1s", "error_class": "server_error"}),
        (RETRY_SCHEDULED, {"tier": "retry-10s", "error_class": "server_error"}),
        (DEAD_LETTERED, {"error_class": "server_error"}),
        (REPROCESSED, {"replay_count": 1}),
        (RETRY_SCHEDULED, {"tier": "retry-1s", "error_class": "timeout"}),
        (SUCCEEDED, {"attempts": 2}),
        (REPROCESSED, {"replay_count": 2, "forced": True}),
        (SUCCEEDED, {"attempts": 1}),
    )
    assert counters == Counter(
        {"received": 1, "retried|retry-1s": 2, "retried|retry-10s": 1, "dead_lettered|server_error": 1, "succeeded": 1}
    )
    assert [h["state"] for h in record["history"]] == [
        "in_flight",
        "retry_scheduled",
        "retry_scheduled",
        "dead_lettered",
        "reprocessed",
        "retry_scheduled",
        "succeeded",
        "reprocessed",
        "succeeded",
    ]
    assert record["replay_count"] == 2 and record["attempts"] == 1


def test_counting_works_on_records_read_back_from_storage():
    """The pipeline loads the previous record from the table, so its state is a plain str."""
    previous = states.load(states.dump(states.transition(None, "r", SUCCEEDED, T0)))
    assert isinstance(previous["state"], str) and previous["succeeded_once"] is True
    new = states.transition(previous, "r", SUCCEEDED, T0 + 1)
    assert states.counted(previous, new) == []
    retried = states.load(states.dump(states.transition(None, "q", RETRY_SCHEDULED, T0, tier="retry-1s")))
    assert states.counted(retried, states.transition(retried, "q", SUCCEEDED, T0 + 1)) == ["succeeded"]
    assert json.loads(states.dump(new))["history"][-1]["state"] == "succeeded"
