"""Kafka's own console producer and consumer (the jars scripts/kafka-local fetches) against a worker.

Requests go in with `kafka-console-producer` semantics (key and headers parsed from each line);
results and dead letters come out through `kafka-console-consumer`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.kafka_tools import CONSOLE_CONSUMER, CONSOLE_PRODUCER, kafka_jars, run_tool
from tests.support import Worker, unique


@pytest.fixture(scope="module")
def jars() -> Path:
    path = kafka_jars()
    if shutil.which("java") is None:
        pytest.skip("java is not installed")
    if not (path / ".complete").exists():
        pytest.skip(f"no Kafka jars in {path}: run scripts/kafka-local start once")
    return path


def consume(jars: Path, worker: Worker, topic: str, count: int) -> list[tuple[dict[str, str], str, str]]:
    """(headers, key, value) of the first `count` records of a topic, as the console consumer prints them."""
    out = run_tool(
        CONSOLE_CONSUMER,
        "--bootstrap-server",
        worker.bootstrap,
        "--topic",
        worker.topic(topic),
        "--from-beginning",
        "--max-messages",
        str(count),
        "--timeout-ms",
        "90000",
        "--property",
        "print.headers=true",
        "--property",
        "print.key=true",
        "--property",
        "headers.separator=\x1f",
        "--property",
        "key.separator=\x1e",
        timeout=150,
    )
    records = []
    for line in filter(None, out.split("\n")):  # not splitlines(): it splits at \x1d-\x1f too
        header_text, key, value = line.split("\x1e", 2)
        headers = dict(h.split(":", 1) for h in header_text.split("\x1f") if ":" in h)  # NO_HEADERS has none
        records.append((headers, key, value))
    return records


def test_console_producer_in_console_consumer_out(make_worker, jars):
    worker = make_worker(env_extra={"DLQ_SIMULATED_SUCCESS_RATE": "1", "DLQ_RETRY_DELAYS": "200ms"}).start()
    good, bad, original = unique("console"), unique("console-bad"), unique("first")  # `bad` keys the unparseable one
    request = json.dumps(
        {
            "request_id": good,
            "messages": [{"role": "user", "content": "from the console"}],
            "metadata": {"via": "console"},
        }
    )
    lines = (
        f"replay_of:{original},replay_count:1\t{good}\t{request}\n"  # headers <TAB> key <TAB> value
        f"origin:console\t{bad}\tthis is not json\n"
    )
    run_tool(
        CONSOLE_PRODUCER,
        "--bootstrap-server",
        worker.bootstrap,
        "--topic",
        worker.topic("input"),
        "--property",
        "parse.key=true",
        "--property",
        "parse.headers=true",
        "--producer-property",
        "acks=all",
        stdin=lines,
    )

    ((headers, key, value),) = consume(jars, worker, "results", 1)
    result = json.loads(value)
    assert (
        key == good and result["request_id"] == good and result["metadata"] == {"via": "console"} and result["output"]
    )
    assert (
        headers.get("replay_of") == original and headers.get("replay_count") == "1"
    )  # lineage from the producer's headers

    ((headers, key, value),) = consume(jars, worker, "dlq", 1)
    assert value == "this is not json"
    assert headers["error_class"] in ("invalid_request", "poison"), headers
    assert key == headers["request_id"] and key.startswith("invalid-")  # no request id inside: keyed by the payload
    assert json.loads(headers["source"])["topic"] == worker.topic("input")
