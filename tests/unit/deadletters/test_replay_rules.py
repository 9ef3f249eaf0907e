"""The replay rules (docs/operations.md): a replay never cancels, supersedes or duplicates the
live chain of another copy of its request."""

from __future__ import annotations

import asyncio
import json

from dlqapp.core.errors import ErrorClass
from dlqapp.retries.keys import parked_key
from tests.unit.fakes import FakeMessage, ScriptedBackend, consumed, request, state_of, worker


def run(coro):
    return asyncio.run(coro)


def record_dead_letters(w) -> None:
    """What the dlq agent does with every dead letter sent so far."""
    for offset, (key, value, headers, partition) in enumerate(w.dlq.sent):
        if value is not None:
            message = FakeMessage("dlq", partition, offset)
            run(w.recorder.on_message(consumed(key, value, {k: v.encode() for k, v in headers.items()}, message)))


def test_replaying_an_invalid_copy_while_its_request_is_parked_is_refused_and_the_request_still_ends():
    """Issue 39, case 1: the replay of every invalid_request dead letter took X's parked retry
    for superseded, and X never ended."""
    import tempfile

    w = worker(tempfile.mkdtemp(), ScriptedBackend({"X": 1}))  # fails once with server_error
    run(w.pipeline.on_input(consumed(b"X", request("X"), message=FakeMessage("input", 0, 0)), w.input))
    assert state_of(w, "X")["state"] == "retry_scheduled"
    invalid = consumed(b"X", json.dumps({"request_id": "X"}).encode(), message=FakeMessage("input", 0, 1))
    run(w.pipeline.on_input(invalid, w.input))
    record_dead_letters(w)
    (copy_key,) = [k for k in w.dead_letters_table if k.startswith(b"X~invalid_request~")]
    answer = run(w.operator.execute({"action": "replay", "request_id": copy_key.decode(), "actor": "op"}))
    assert answer["status"] == "refused" and "being retried" in answer["reason"]
    assert state_of(w, "X")["state"] == "retry_scheduled" and copy_key in w.dead_letters_table
    assert w.input.sent == []  # nothing replayed
    # the parked retry is not superseded: it runs when due and X ends with one result
    due = state_of(w, "X")["due"]
    w.clock.now = due
    run(w.scheduler.on_due(consumed(b"X", parked_key(due, "X"), message=FakeMessage("due"))))
    assert w.results.keys() == ["X"] and state_of(w, "X")["state"] == "succeeded"
    # once it succeeded, the copy's replay is refused unless forced (it would call the model again)
    again = run(w.operator.execute({"action": "replay", "request_id": copy_key.decode(), "actor": "op"}))
    assert again["status"] == "refused" and "force" in again["reason"]


def test_replaying_the_invalid_copy_of_a_request_that_ended_in_the_dlq_starts_its_next_chain():
    import tempfile

    w = worker(tempfile.mkdtemp())
    invalid = consumed(b"Y", json.dumps({"request_id": "Y"}).encode(), message=FakeMessage("input", 0, 0))
    run(w.pipeline.on_input(invalid, w.input))  # never seen before: its state ends dead-lettered
    record_dead_letters(w)
    (copy_key,) = list(w.dead_letters_table)
    edited = {"request_id": "Y", "prompt": "fixed"}
    answer = run(
        w.operator.execute({"action": "replay", "request_id": copy_key.decode(), "actor": "op", "payload": edited})
    )
    assert answer["status"] == "reprocessed" and answer["replay_count"] == 1
    key, value, headers, _ = w.input.sent[-1]
    replay = consumed(key, value, {k: v.encode() for k, v in headers.items()}, FakeMessage("input", 0, 3))
    run(w.pipeline.on_input(replay, w.input))
    assert state_of(w, "Y")["state"] == "succeeded" and w.results.keys() == ["Y"]


def test_a_replay_whose_payload_is_invalid_again_ends_the_chain_it_started():
    """The replayed message is the request's live chain: dead-lettered again, its state must end
    dead_lettered, not stay `reprocessed` for ever."""
    import tempfile

    w = worker(tempfile.mkdtemp())
    invalid = consumed(b"Z", json.dumps({"request_id": "Z"}).encode(), message=FakeMessage("input", 0, 0))
    run(w.pipeline.on_input(invalid, w.input))
    record_dead_letters(w)
    (copy_key,) = list(w.dead_letters_table)
    answer = run(w.operator.execute({"action": "replay", "request_id": copy_key.decode(), "actor": "op"}))
    assert answer["status"] == "reprocessed" and state_of(w, "Z")["state"] == "reprocessed"
    key, value, headers, _ = w.input.sent[-1]  # the same invalid bytes again
    replay = consumed(key, value, {k: v.encode() for k, v in headers.items()}, FakeMessage("input", 0, 2))
    run(w.pipeline.on_input(replay, w.input))
    assert state_of(w, "Z")["state"] == "dead_lettered"
    assert w.dlq.sent[-1][2]["replay_count"] == "1"  # the outcome names the chain it ends


def test_a_poisoned_requests_stored_in_flight_state_ends_dead_lettered():
    import tempfile

    from dlqapp.core import states
    from dlqapp.deadletters.writer import ends_its_chain

    w = worker(tempfile.mkdtemp())
    stuck = states.transition(None, "P", states.IN_FLIGHT, 1)
    record = consumed(b"P", request("P"), message=FakeMessage("input", 0, 4))
    assert ends_its_chain(stuck, record, ErrorClass.POISON)
    assert not ends_its_chain(stuck, record, ErrorClass.INVALID_REQUEST)  # an invalid copy: not its chain
    del w
