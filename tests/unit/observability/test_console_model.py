"""The console's read models and retry actions over fakes: minute rates, alerts, merges,
the token estimate, run now and dead-letter now (one outcome when the timer fires too)."""

from __future__ import annotations

import asyncio
import json
import math

from dlqapp.core.headers import H_RUN_NOW
from dlqapp.deadletters.estimate import estimated_tokens
from dlqapp.observability.health import MINUTE_MS, MinuteRates, merge_health, worker_alerts
from dlqapp.observability.lateness import LatenessWindow
from dlqapp.retries.keys import decode_parked_key
from dlqapp.retries.listing import merge_retries
from tests.unit.fakes import FakeMessage, ScriptedBackend, consumed, request, state_of, worker


def run(coro):
    return asyncio.run(coro)


def test_minute_rates_keep_fifteen_minutes_and_only_the_four_series():
    rates = MinuteRates()
    start = 100 * MINUTE_MS
    rates.add("received", 2, start)
    rates.add("retried|app.retry-1s", 1, start + 30_000)
    rates.add("dlq_size", 5, start)  # not a rate
    rates.add("dead_lettered|timeout", -1, start)  # a correction, not a rate
    points = rates.series(start + 59_000)
    assert len(points) == 15 and points[-1] == {
        "minute": start,
        "received": 2,
        "succeeded": 0,
        "retried": 1,
        "dead_lettered": 0,
    }
    later = start + 15 * MINUTE_MS
    rates.add("succeeded", 1, later)
    points = rates.series(later)
    assert all(p["received"] == 0 for p in points) and points[-1]["succeeded"] == 1  # the first minute fell off


def test_lateness_p99_is_exact_per_tier_and_over_the_window():
    window = LatenessWindow(window_ms=60_000)
    assert window.p99_ms(0) is None and window.summary(0) == {}
    for n in range(1, 101):  # 1..100 ms late
        window.add("1s", n, at_ms=1_000 + n)
    window.add("10s", 5_000, at_ms=1_000)
    assert window.summary(2_000)["1s"] == {"count": 100, "p50_ms": 50, "p99_ms": 99, "max_ms": 100}
    assert window.p99_ms(2_000) == 100  # 101 samples, rank ceil(99.99) = 100: 100 ms
    assert window.summary(61_051) == {
        "1s": {"count": 50, "p50_ms": 75, "p99_ms": 100, "max_ms": 100}
    }  # older ones left
    window.add("1s", -30, at_ms=61_051)  # started early on a skewed clock: never negative
    assert window.summary(61_051)["1s"] == {"count": 51, "p50_ms": 75, "p99_ms": 100, "max_ms": 100}
    assert window.p99_ms(200_000) is None


def test_alerts_name_the_breaker_and_what_it_holds_and_stay_quiet_when_healthy():
    now = 1_000_000
    healthy = {"url": "w1", "breaker": {"state": "closed", "waiting": 0}, "consumer_lag": 0}
    assert worker_alerts(healthy, now) == []
    stalled = {
        "url": "w1",
        "breaker": {"state": "open", "waiting": 244, "tripped_since": now - 180_000, "reopens_in_ms": 12_000},
        "consumer_lag": 30,
    }
    (alert,) = worker_alerts(stalled, now)
    assert alert == "circuit breaker open, since 3 min ago, next probe in 12 s, 244 requests held, consumer lag 30"
    idle_probe = {"url": "w1", "breaker": {"state": "half_open", "waiting": 0}}
    assert worker_alerts(idle_probe, now) == []  # nobody is held: the next call probes
    slow = {"url": "w1", "breaker": {"state": "closed"}, "oldest_overdue_ms": 45_000, "event_loop_lag_s": 2.5}
    assert [a.split(":")[0].split(" ")[0] for a in worker_alerts(slow, now)] == ["retries", "event"]
    merged = merge_health([stalled, healthy | {"url": "w2"}], ["http://w3: ClientError: refused"], now)
    assert merged["status"] == "stalled" and merged["total"]["held"] == 244 and merged["total"]["consumer_lag"] == 30
    assert [a["worker"] for a in merged["alerts"]] == ["w1", "http://w3"]


def test_retry_pages_merge_earliest_due_first_with_exact_totals():
    a = {
        "total": 3,
        "items": [{"request_id": "a1", "due_at": 5}, {"request_id": "a2", "due_at": 9}],
        "by_tier": {"retry-1s": 3},
        "by_error_class": {"timeout": 3},
    }
    b = {
        "total": 1,
        "items": [{"request_id": "b1", "due_at": 7}],
        "by_tier": {"retry-1s": 1},
        "by_error_class": {"unknown": 1},
    }
    page = merge_retries([a, b], limit=2, offset=1)
    assert page["total"] == 4 and [i["request_id"] for i in page["items"]] == ["b1", "a2"]
    assert page["by_tier"] == {"retry-1s": 4} and page["by_error_class"] == {"timeout": 3, "unknown": 1}


def test_the_token_estimate_counts_prompt_characters_over_four():
    text = json.dumps(
        {
            "request_id": "r",
            "prompt": "abcd",
            "messages": [
                {"role": "user", "content": "efgh"},
                {"role": "user", "content": [{"type": "text", "text": "ij"}]},
            ],
        }
    )
    assert estimated_tokens(text, len(text)) == math.ceil(len("abcd\nefgh\nij") / 4)
    assert estimated_tokens("not json", 9) == 3
    assert estimated_tokens(None, 8) == 2


class DueHopSpy:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes, int]] = []

    async def send(self, key: bytes, value: bytes, partition: int, *, now: bool = False):
        assert now, "run now is attempted at once, not at the due time"
        self.sent.append((key, value, partition))
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def parked_worker(tmp_path, rid: str):
    w = worker(tmp_path, ScriptedBackend({rid: 1}))
    w.scheduler.handover = DueHopSpy()
    run(w.pipeline.on_input(consumed(rid.encode(), request(rid), message=FakeMessage("input", 0, 0)), w.input))
    (key,) = list(w.parked_table)
    return w, key


def command(action: str, rid: str) -> dict:
    return {"action": action, "request_id": rid, "actor": "tester"}


def test_run_now_hands_the_entry_to_the_due_agent_like_the_timer_and_a_second_fire_does_nothing(tmp_path):
    w, key = parked_worker(tmp_path, "r1")
    answer = run(w.operator.execute(command("run_now", "r1")))
    assert answer["status"] == "fired" and answer["tier"] == "retry-1s"
    assert w.scheduler.handover.sent == [(b"r1", key, w.store.owner("r1"))] and key in w.scheduler.handed_over
    assert run(w.operator.execute(command("run_now", "r1")))["status"] == "refused"  # already handed over
    assert [r["action"] for r in w.operator.ledger_for("r1")] == ["run_now"]
    run(
        w.scheduler.on_due(consumed(b"r1", key, headers={H_RUN_NOW: b"1"}, message=FakeMessage("due")))
    )  # the due agent: attempt, outcome, then delete
    w.clock.now = decode_parked_key(key)[0]
    run(
        w.scheduler.on_due(consumed(b"r1", key, message=FakeMessage("due")))
    )  # the timer's own fire of the same entry arriving late
    assert w.backend.calls_for("r1") == 2 and w.results.keys() == ["r1"] and key not in w.parked_table


def test_dead_letter_now_sends_the_history_to_the_dlq_and_a_concurrent_due_message_is_ignored(tmp_path):
    w, key = parked_worker(tmp_path, "r2")

    async def both() -> list:
        due = consumed(b"r2", key, message=FakeMessage("due"))
        return await asyncio.gather(w.operator.execute(command("dead_letter_now", "r2")), w.scheduler.on_due(due))

    answer, _ = run(both())
    assert answer["status"] == "dead_lettered" and answer["error_class"] == "server_error"
    assert w.backend.calls_for("r2") == 1 and w.results.keys() == []  # the due message found it claimed
    ((dlq_key, _, headers, _),) = w.dlq.sent
    assert dlq_key == b"r2" and "dead-lettered by tester" in headers["final_error"]
    assert [a["attempt"] for a in json.loads(headers["attempt_history"])] == [1]
    assert key not in w.parked_table and state_of(w, "r2")["state"] == "dead_lettered"
    assert w.operator.ledger_for("r2")[-1]["action"] == "dead_letter_now"
