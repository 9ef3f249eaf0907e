"""Which parked retries are stale copies (dlqapp.retries.scheduler)."""

import json

from dlqapp.core.envelope import Envelope
from dlqapp.core.states import StoredState
from dlqapp.retries.scheduler import superseded_by


def stored(doc: dict) -> StoredState:
    """A request state as the requests table holds it."""
    return StoredState.decode(json.dumps({"request_id": "r", **doc}).encode())


def test_a_stale_copy_of_a_retry_chain_is_recognised():
    envelope = Envelope("r", b"{}", 0, {}, attempts=2)
    assert superseded_by(None, envelope) is None
    assert superseded_by(stored({"state": "retry_scheduled", "attempts": 2}), envelope) is None
    assert "newer attempt" in superseded_by(stored({"state": "retry_scheduled", "attempts": 3}), envelope)
    assert "newer attempt" in superseded_by(stored({"state": "dead_lettered", "attempts": 4}), envelope)
    assert superseded_by(stored({"state": "succeeded", "attempts": 1}), envelope) == "already succeeded"
    assert superseded_by(stored({"state": "reprocessed", "attempts": 4}), envelope) is None  # a replay starts over
