"""One bad message never stops a worker: hostile keys, values and headers on every topic
dlqapp consumes (input, the tiers, due, dlq, commands), each followed by a valid request.

`make test` runs a modest fuzz; `make chaos` (CHAOS_FULL=1) a larger one.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.kafka_io import (
    keys_seen,
    produce,
    read_topic,
    request_bytes,
)
from tests.support import unique, wait_until

EXAMPLES = 300 if os.environ.get("CHAOS_FULL") else 40
DLQAPP_HEADERS = [
    "retry_count",
    "attempts",
    "scheduled_time",
    "original_timestamp",
    "error_class",
    "last_error",
    "final_error",
    "attempt_history",
    "request_id",
    "source",
    "dead_at",
    "replay_of",
    "replay_count",
    "replayed_by",
    "replayed_at",
    "first_seen",
    "payload_null",
]
TOPICS = ["input", "retry-1s", "retry-2s", "retry-3s", "dlqapp-due", "dlq", "dlqapp-commands"]

header_values = st.one_of(
    st.binary(max_size=40),
    st.sampled_from(
        [b"", b"-1", b"abc", b"1e3", b"99999999999999999999999", b"null", b"[]", b"{}", b"5", b"\xff\xfe", b"\x00"]
    ),
    st.integers(min_value=0, max_value=2**63).map(lambda n: str(n).encode()),
    st.just(b"x" * 20_000),
)
headers = st.lists(
    st.tuples(st.one_of(st.sampled_from(DLQAPP_HEADERS), st.text(max_size=10)), header_values), max_size=8
)
keys = st.one_of(st.none(), st.binary(max_size=30), st.sampled_from([b"", b"\xff\xfe", b"k" * 300]))
values = st.one_of(
    st.none(),
    st.binary(max_size=200),
    st.sampled_from(
        [b"{}", b"null", b"[]", b'{"action": "replay"}', b'{"request_id": 5}', b"\x00\x00\x00\x00\x00\x00\x00\x01x"]
    ),
)


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker(DLQ_SIMULATED_SUCCESS_RATE="1.0", DLQ_RETRY_DELAYS="1s,2s,3s")


FOLLOWERS: list[str] = []
VALID_WITH_HOSTILE_HEADERS: list[str] = []


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(topic=st.sampled_from(TOPICS), key=keys, value=values, hdrs=headers, valid_payload=st.booleans())
def test_hostile_messages_on_every_topic_are_followed_by_a_valid_request(
    worker, topic, key, value, hdrs, valid_payload
):
    if valid_payload and topic == "input":
        rid = unique("hostile-headers")
        VALID_WITH_HOSTILE_HEADERS.append(rid)
        key, value = rid.encode(), request_bytes(rid)
    if key is None and (value is None or topic == "dlq"):
        key = b""  # Kafka needs one of the two, and a key on a compacted topic
    produce(worker.bootstrap, worker.topic(topic), [(key, value)], headers=hdrs)
    follower = unique("follower")
    FOLLOWERS.append(follower)
    produce(worker.bootstrap, worker.topic("input"), [(follower.encode(), request_bytes(follower))])
    assert worker.process.poll() is None, worker.log_tail()


def test_the_worker_survived_and_every_valid_request_got_its_outcome(worker):
    assert FOLLOWERS, "the fuzz above must run first"
    read_topic(worker.bootstrap, worker.topic("results"), lambda r: set(FOLLOWERS) <= keys_seen(r), 180)
    wanted = set(VALID_WITH_HOSTILE_HEADERS)

    def settled(records) -> bool:
        seen = {r.key.decode("utf-8", "replace").split("~")[0] for r in records if r.key and r.value is not None}
        return wanted <= seen

    read_topic(worker.bootstrap, [worker.topic("results"), worker.topic("dlq")], settled, 180)
    assert worker.process.poll() is None, worker.log_tail()
    log = worker.log_path.read_text(errors="replace")
    assert "fatal" not in log.lower() and "Crashed reason" not in log  # no agent died and restarted either


def test_known_crashers_are_handled(worker):
    """The two headers of issue 12: a bad original_timestamp, and replay_count on a dead letter."""
    timestamp = unique("bad-timestamp")
    produce(
        worker.bootstrap,
        worker.topic("input"),
        [(timestamp.encode(), request_bytes(timestamp))],
        headers=[("original_timestamp", b"abc")],
    )
    replay = unique("bad-replay-count")
    doomed = request_bytes(replay, metadata={"simulate": {"fail_times": 1, "error": "auth_error"}})
    produce(worker.bootstrap, worker.topic("input"), [(replay.encode(), doomed)], headers=[("replay_count", b"x")])
    read_topic(worker.bootstrap, worker.topic("results"), lambda r: timestamp in keys_seen(r), 60)
    _, entry = wait_until(
        lambda: (lambda a: a if a[0] == 200 else None)(worker.get(f"/dlq/{replay}/")),
        60,
        "the dead letter to be recorded",
    )
    assert entry["error_class"] == "auth_error" and entry["replay_count"] == 0
    assert worker.process.poll() is None


def test_undecodable_operator_commands_are_dead_lettered_with_their_bytes(worker):
    junk = [
        b"{not json " + unique("c").encode(),
        b"\xff\xfe" + unique("c").encode(),
        b'{"action": "replay", "tag": "' + unique("c").encode() + b'"}',
    ]
    produce(worker.bootstrap, worker.topic("dlqapp-commands"), [(b"k", value) for value in junk])
    records = read_topic(worker.bootstrap, worker.topic("dlq"), lambda r: set(junk) <= {x.value for x in r}, 60)
    for record in records:
        if record.value in junk:
            assert record.headers["error_class"] == "invalid_request"
            assert "operator command" in record.headers["final_error"]
    assert "Crashed reason" not in worker.log_path.read_text(errors="replace")


def test_a_message_that_kills_the_worker_is_dead_lettered_as_poison_after_a_few_crashes(make_worker):
    """The crash-loop guard: `simulate.crash` ends the process like a native crash would."""
    worker = make_worker(env_extra={"DLQ_POISON_AFTER_CRASHES": "2", "DLQ_SIMULATED_SUCCESS_RATE": "1.0"}).start()
    killer, after = unique("killer"), unique("after-killer")
    produce(
        worker.bootstrap,
        worker.topic("input"),
        [(b"same", request_bytes(killer, metadata={"simulate": {"crash": True}})), (b"same", request_bytes(after))],
    )
    deaths = 0

    def poisoned():
        nonlocal deaths
        if worker.process.poll() is not None:  # a supervisor restarting the crashed worker
            deaths += 1
            assert deaths <= 5, f"still crashing after {deaths} restarts:\n{worker.log_tail()}"
            worker.start(wait=False)
            return None
        try:
            status, body = worker.get(f"/dlq/{killer}/")
        except OSError:
            return None
        return body if status == 200 else None

    entry = wait_until(poisoned, 280, "the poison dead letter", interval=0.5)
    assert deaths >= 1
    assert entry["error_class"] == "poison" and "died" in entry["final_error"]
    read_topic(worker.bootstrap, worker.topic("results"), lambda r: after in keys_seen(r), 60)
