"""Which parked retries are stale copies (dlqapp.retries.scheduler)."""

from dlqapp.core.envelope import Envelope
from dlqapp.retries.scheduler import superseded_by


def test_a_stale_copy_of_a_retry_chain_is_recognised():
    envelope = Envelope("r", b"{}", 0, {}, attempts=2)
    assert superseded_by(None, envelope) is None
    assert superseded_by({"state": "retry_scheduled", "attempts": 2}, envelope) is None
    assert "newer attempt" in superseded_by({"state": "retry_scheduled", "attempts": 3}, envelope)
    assert "newer attempt" in superseded_by({"state": "dead_lettered", "attempts": 4}, envelope)
    assert superseded_by({"state": "succeeded", "attempts": 1}, envelope) == "already succeeded"
    assert superseded_by({"state": "reprocessed", "attempts": 4}, envelope) is None  # a replay starts over
