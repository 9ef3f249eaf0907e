"""The core paths over in-memory fakes: input, outcomes, due retries, replays, the recorder."""

from __future__ import annotations

import asyncio
import json

from dlqapp.core.errors import ErrorClass
from dlqapp.core.record import Record
from dlqapp.retries.keys import parked_key
from tests.unit.fakes import (
    FakeMessage,
    ScriptedBackend,
    consumed,
    request,
    state_of,
    worker,
)


def run(coro):
    return asyncio.run(coro)


def input_event(request_id: str, value: bytes | None = None, offset: int = 0) -> Record:
    return consumed(
        request_id.encode(),
        value if value is not None else request(request_id),
        message=FakeMessage("input", 0, offset),
    )


def test_a_request_that_succeeds_is_published_once_and_a_duplicate_is_skipped(tmp_path):
    w = worker(tmp_path)
    run(w.pipeline.on_input(input_event("r1"), w.input))
    assert w.results.keys() == ["r1"] and state_of(w, "r1")["state"] == "succeeded"
    run(w.pipeline.on_input(input_event("r1", offset=1), w.input))
    assert w.results.keys() == ["r1"] and w.backend.calls_for("r1") == 1
    assert state_of(w, "r1")["duplicates"] == 1
    assert w.counts["received"] == 1 and w.counts["succeeded"] == 1 and w.counts["duplicates_skipped"] == 1


def test_a_retryable_failure_is_published_on_the_tier_parked_and_recorded(tmp_path):
    w = worker(tmp_path, ScriptedBackend({"r2": 1}))
    run(w.pipeline.on_input(input_event("r2"), w.input))
    key, _, headers, _ = w.tiers[0].sent[0]
    assert key == b"r2" and headers["retry_count"] == "1" and headers["error_class"] == "server_error"
    due = w.clock.now + 1000
    assert int(headers["scheduled_time"]) == due
    assert parked_key(due, "r2") in w.parked_table
    assert state_of(w, "r2")["state"] == "retry_scheduled" and w.parked.by_tier[0] == 1


def test_an_invalid_copy_changes_no_state_and_gets_a_dlq_key_of_its_own(tmp_path):
    w = worker(tmp_path)
    run(w.pipeline.on_input(input_event("r3"), w.input))
    run(w.pipeline.on_input(input_event("r3", json.dumps({"request_id": "r3"}).encode(), offset=1), w.input))
    ((dlq_key, value, headers, _),) = w.dlq.sent
    assert dlq_key.decode().startswith("r3~invalid_request~") and value == b'{"request_id": "r3"}'
    assert headers["error_class"] == "invalid_request" and "either messages or prompt" in headers["final_error"]
    assert state_of(w, "r3")["state"] == "succeeded"


def test_a_due_retry_is_attempted_then_deleted_and_a_stale_one_only_deleted(tmp_path):
    w = worker(tmp_path, ScriptedBackend({"r4": 1}))
    run(w.pipeline.on_input(input_event("r4"), w.input))
    key = next(iter(w.parked_table))
    w.clock.now += 1000
    run(w.scheduler.on_due(consumed(b"r4", key, message=FakeMessage("due"))))
    assert w.results.keys() == ["r4"] and key not in w.parked_table and w.backend.calls_for("r4") == 2
    assert w.parked.by_tier_label() == {"retry-1s": 0, "retry-10s": 0, "retry-1m": 0}
    assert json.loads(w.results.sent[0][1])["attempts"] == 2
    # a copy of the same retry (left by a crash) finds the request succeeded: no call
    w.parked_table[key] = _envelope_blob(w, "r4")
    run(w.scheduler.on_due(consumed(b"r4", key, message=FakeMessage("due"))))
    assert w.backend.calls_for("r4") == 2 and key not in w.parked_table


def test_a_due_message_the_timer_did_not_write_is_dead_lettered_as_invalid_not_poison(tmp_path):
    w = worker(tmp_path)
    run(w.scheduler.on_due(consumed(b"odd", None, message=FakeMessage("due"))))
    ((_, _, headers, _),) = w.dlq.sent
    assert headers["error_class"] == "invalid_request" and "parked-retry key" in headers["final_error"]


def _envelope_blob(w, request_id: str) -> bytes:
    from dlqapp.core.envelope import Envelope

    envelope = Envelope(request_id, request(request_id), w.clock.now, {}, attempts=1, due_ms=w.clock.now)
    return envelope.to_bytes()


def test_a_non_retryable_failure_is_dead_lettered_at_once_and_recorded(tmp_path):
    w = worker(tmp_path, ScriptedBackend({"r5": 9}, error=ErrorClass.AUTH_ERROR))
    run(w.pipeline.on_input(input_event("r5"), w.input))
    ((key, value, headers, partition),) = w.dlq.sent
    assert key == b"r5" and headers["error_class"] == "auth_error" and state_of(w, "r5")["state"] == "dead_lettered"
    run(
        w.recorder.on_message(
            consumed(key, value, {k: v.encode() for k, v in headers.items()}, FakeMessage("dlq", partition, 7))
        )
    )
    entry = json.loads(w.dead_letters_table[b"r5"])
    assert entry["error_class"] == "auth_error" and entry["dlq"] == {"partition": 0, "offset": 7}
    assert w.counts["dlq_size"] == 1 and w.counts["dlq_class|auth_error"] == 1
    assert w.components.oldest_dead_letter.value == entry["dead_at"], "the oldest at once, not at the next walk"
    w.recorder.log.flush()
    assert (tmp_path / "dead-letters.jsonl").read_text().count("\n") == 1


def _dead(w, request_id: str) -> None:
    run(w.pipeline.on_input(input_event(request_id), w.input))
    key, value, headers, partition = w.dlq.sent[-1]
    run(
        w.recorder.on_message(
            consumed(
                key, value, {k: v.encode() for k, v in headers.items()}, FakeMessage("dlq", partition, len(w.dlq.sent))
            )
        )
    )


def test_replay_sends_the_payload_back_removes_the_entry_and_writes_state_first(tmp_path):
    w = worker(tmp_path, ScriptedBackend({"r6": 1}, error=ErrorClass.AUTH_ERROR))
    _dead(w, "r6")
    answer = run(w.operator.execute({"action": "replay", "request_id": "r6", "actor": "test"}))
    assert answer["status"] == "reprocessed" and answer["replay_count"] == 1
    ((key, value, headers, _),) = w.input.sent
    assert (
        key == b"r6" and value == request("r6") and headers["replay_count"] == "1" and headers["replayed_by"] == "test"
    )
    assert b"r6" not in w.dead_letters_table and w.dlq.sent[-1][1] is None  # tombstone
    assert state_of(w, "r6")["state"] == "reprocessed" and json.loads(w.ledger[b"r6"])[0]["action"] == "replay"
    assert w.counts["dlq_size"] == 0 and w.counts["reprocessed"] == 1


def test_replay_of_a_request_that_succeeded_since_is_refused_unless_forced(tmp_path):
    w = worker(tmp_path, ScriptedBackend({"r7": 1}, error=ErrorClass.AUTH_ERROR))
    _dead(w, "r7")
    w.clock.now += 60_000
    resent = consumed(b"r7", request("r7"), message=FakeMessage("input", 0, 5, timestamp=w.clock.now / 1000))
    run(w.pipeline.on_input(resent, w.input))  # re-sent a minute later; the second call succeeds
    assert state_of(w, "r7")["state"] == "succeeded"
    refused = run(w.operator.execute({"action": "replay", "request_id": "r7", "actor": "test"}))
    assert refused["status"] == "refused" and "force" in refused["reason"] and w.input.sent == []
    forced = run(w.operator.execute({"action": "replay", "request_id": "r7", "actor": "test", "force": True}))
    assert forced["status"] == "reprocessed" and len(w.input.sent) == 1


def test_discard_and_unknown_commands(tmp_path):
    w = worker(tmp_path, ScriptedBackend({"r8": 1}, error=ErrorClass.AUTH_ERROR))
    _dead(w, "r8")
    assert run(w.operator.execute({"action": "discard", "request_id": "r8", "actor": "t"}))["status"] == "discarded"
    assert state_of(w, "r8")["state"] == "discarded" and b"r8" not in w.dead_letters_table
    assert run(w.operator.execute({"action": "discard", "request_id": "r8", "actor": "t"}))["status"] == "not_found"
    for bad in (["x"], {"action": "explode", "request_id": "r8", "actor": "t"}, {"request_id": "r8"}):
        try:
            run(w.operator.execute(bad))
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} must be refused as not a command")


def test_expire_deletes_only_what_did_not_change(tmp_path):
    w = worker(tmp_path)
    run(w.pipeline.on_input(input_event("old"), w.input))
    at = state_of(w, "old")["updated_at"]
    answer = run(
        w.operator.execute(
            {
                "action": "expire",
                "request_id": "old",
                "actor": "retention",
                "table": "requests",
                "expired": [["old", at - 1]],
            }
        )
    )
    assert answer["removed"] == 0 and state_of(w, "old") is not None  # changed since the sweep read it
    answer = run(
        w.operator.execute(
            {
                "action": "expire",
                "request_id": "old",
                "actor": "retention",
                "table": "requests",
                "expired": [["old", at]],
            }
        )
    )
    assert answer["removed"] == 1 and state_of(w, "old") is None


def test_the_retry_timer_tick_fires_due_retries_and_recounts(tmp_path):
    from dlqapp.wiring.services import RetryTimer

    w = worker(tmp_path)
    calls = []

    async def hand_over_due():
        calls.append("fire")
        return 0

    async def recount():
        calls.append("recount")

    w.scheduler.hand_over_due = hand_over_due
    w.parked.recount_if_reassigned = recount
    timer = RetryTimer(app=None, scheduler=w.scheduler, interval_ms=20)
    run(timer.tick())
    assert calls == ["fire", "recount"]


def test_a_message_whose_request_already_succeeded_is_known_as_such_before_it_is_called_poison(tmp_path):
    """The crash guard names a message poison after it was in progress at three unclean
    stops; one first in line after each restart (result written, offset not committed)
    must not get a dead letter beside its result (dlqapp.wiring.agents: poison)."""
    w = worker(tmp_path)
    run(w.pipeline.on_input(input_event("r9"), w.input))
    assert w.pipeline.dedup.already_succeeded(input_event("r9", offset=1))
    assert not w.pipeline.dedup.already_succeeded(input_event("never-seen", offset=2))
    assert not w.pipeline.dedup.already_succeeded(input_event("r9", b"\xff not json", offset=3))


def test_a_request_whose_attempt_died_in_flight_runs_when_its_message_comes_again(tmp_path):
    """A copy seen while the first attempt runs records the request as in flight; if that
    attempt then dies without an outcome (its partition moved, its transaction was fenced),
    the message redelivered to the next owner must run, not be skipped as a duplicate."""
    w = worker(tmp_path)
    sent_at = w.clock.now / 1000 - 5
    message = lambda: consumed(b"r11", request("r11"), message=FakeMessage("input", 0, 0, timestamp=sent_at))  # noqa: E731
    w.pipeline.in_flight.add("r11")  # the first attempt is waiting for its call
    run(w.pipeline.on_input(message(), w.input))
    assert state_of(w, "r11")["state"] == "in_flight" and w.backend.calls_for("r11") == 0
    w.pipeline.in_flight.discard("r11")  # ... and dies with its partition, no outcome written
    run(w.pipeline.on_input(message(), w.input))
    assert (
        w.backend.calls_for("r11") == 1 and w.results.keys() == ["r11"] and state_of(w, "r11")["state"] == "succeeded"
    )
    assert w.counts["received"] == 1 and w.counts["succeeded"] == 1


def test_the_same_message_redelivered_after_its_request_was_dead_lettered_is_a_duplicate_but_a_later_copy_is_new(
    tmp_path,
):
    """at_least_once: after a crash the input message that started a request can come again
    (its offset was not committed); by then the request may be dead-lettered, and calling it
    again would pay twice and give it a result beside its dead letter. A copy written later is
    a new request. (Under exactly_once the door skips a redelivered message by the partition's
    committed progress instead: tests/unit/kafka/test_acks.py, tests/unit/processing.)"""
    w = worker(
        tmp_path,
        ScriptedBackend({"r10": 1}, error=ErrorClass.AUTH_ERROR),
        DLQ_PROCESSING_GUARANTEE="at_least_once",
    )
    sent_at = w.clock.now / 1000 - 5  # written five seconds before the worker first saw it
    run(
        w.pipeline.on_input(
            consumed(b"r10", request("r10"), message=FakeMessage("input", 0, 0, timestamp=sent_at)), w.input
        )
    )
    assert state_of(w, "r10")["state"] == "dead_lettered" and w.backend.calls_for("r10") == 1
    run(
        w.pipeline.on_input(
            consumed(b"r10", request("r10"), message=FakeMessage("input", 0, 0, timestamp=sent_at)), w.input
        )
    )
    assert w.backend.calls_for("r10") == 1 and state_of(w, "r10")["duplicates"] == 1  # the same message again
    w.clock.now += 60_000
    run(
        w.pipeline.on_input(
            consumed(b"r10", request("r10"), message=FakeMessage("input", 0, 5, timestamp=w.clock.now / 1000)), w.input
        )
    )
    assert (
        w.backend.calls_for("r10") == 2 and state_of(w, "r10")["state"] == "succeeded"
    )  # re-sent later: a new request


def test_under_exactly_once_a_copy_of_a_dead_lettered_request_is_a_new_chain_whatever_the_producers_clock():
    """A producer whose clock runs behind wrote the copy 'before' the request was first seen:
    under exactly_once that says nothing (redeliveries never reach the pipeline), so the copy
    is judged by the request's state alone: dead-lettered, it runs again."""
    import tempfile

    w = worker(tempfile.mkdtemp(), ScriptedBackend({"r20": 1}, error=ErrorClass.AUTH_ERROR))
    run(w.pipeline.on_input(input_event("r20"), w.input))
    assert state_of(w, "r20")["state"] == "dead_lettered"
    behind = w.clock.now / 1000 - 300  # five minutes behind
    run(
        w.pipeline.on_input(
            consumed(b"r20", request("r20"), message=FakeMessage("input", 0, 1, timestamp=behind)), w.input
        )
    )
    assert w.backend.calls_for("r20") == 2 and state_of(w, "r20")["state"] == "succeeded"


def test_a_copy_sent_while_a_replay_is_on_its_way_is_a_duplicate_and_the_replay_itself_runs(tmp_path):
    w = worker(tmp_path, ScriptedBackend({"r21": 1}, error=ErrorClass.AUTH_ERROR))
    run(w.pipeline.on_input(input_event("r21"), w.input))
    (dead,) = [key for key, *_ in w.dlq.sent]
    run(
        w.recorder.on_message(
            consumed(
                dead,
                w.dlq.sent[0][1],
                w.dlq.sent[0][2] and {k: v.encode() for k, v in w.dlq.sent[0][2].items()},
                FakeMessage("dlq", 0, 0),
            )
        )
    )
    answer = run(w.operator.execute({"action": "replay", "request_id": "r21", "actor": "op"}))
    assert answer["status"] == "reprocessed" and state_of(w, "r21")["state"] == "reprocessed"
    run(w.pipeline.on_input(input_event("r21", offset=5), w.input))  # the producer's copy, first
    assert w.backend.calls_for("r21") == 1 and state_of(w, "r21")["duplicates"] == 1
    key, value, headers, _ = w.input.sent[-1]  # the replay message
    replay = consumed(key, value, {k: v.encode() for k, v in headers.items()}, FakeMessage("input", 0, 6))
    run(w.pipeline.on_input(replay, w.input))
    assert w.backend.calls_for("r21") == 2 and state_of(w, "r21")["state"] == "succeeded"


def test_a_message_too_large_to_re_key_is_not_forwarded_into_a_topic_that_would_refuse_it(tmp_path):
    """A forward adds headers; a record at input's limit would no longer fit input, and the
    transaction carrying it would fail on every attempt."""
    w = worker(tmp_path)
    small = consumed(None, request("r30"), message=FakeMessage("input", 0, 3))
    assert w.store.fits_forward(small, "r30", limit=len(request("r30")) + 1024)
    big = consumed(None, b"x" * 1000, message=FakeMessage("input", 0, 4))
    assert not w.store.fits_forward(big, "r31", limit=1000)
    assert not w.store.fits_forward(big, "r31", limit=1100)  # its forward headers and framing too
