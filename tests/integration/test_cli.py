"""The CLI commands against a running worker, over HTTP."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.kafka_io import produce, request_bytes
from tests.support import FAUST, unique, wait_until


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker(DLQ_RETRY_DELAYS="200ms,400ms,600ms", DLQ_SIMULATED_SUCCESS_RATE="1.0")


def cli(worker, *args, url=None):
    env = {**worker.env(), "DLQ_WEB_URL": url or worker.url}
    return subprocess.run(
        [str(FAUST), "-A", "dlqapp", *args], env=env, cwd=worker.tmp, capture_output=True, text=True, timeout=120
    )


def dead(worker, error="auth_error", fail_times=1):
    rid = unique("cli")
    produce(
        worker.bootstrap,
        worker.topic("input"),
        [(rid.encode(), request_bytes(rid, metadata={"simulate": {"fail_times": fail_times, "error": error}}))],
    )
    wait_until(lambda: worker.get(f"/dlq/{rid}/")[0] == 200, 30, f"{rid} in the DLQ")
    return rid


def test_generate_then_list_stats_and_show(worker):
    result = cli(worker, "generate", "--count", "40", "--fail-share", "0.25", "--invalid-share", "0.05", "--json")
    assert result.returncode == 0, result.stderr
    produced = json.loads(result.stdout)
    assert produced["produced"] == 40
    prefix = produced["prefix"]
    wait_until(lambda: worker.get("/dlq/stats/")[1]["received"] >= 35, 60, "generated requests to be processed")
    listed = cli(worker, "dlq-list", "--limit", "10")
    assert listed.returncode == 0 and "REQUEST" in listed.stdout and "dead letters" in listed.stdout
    page = json.loads(cli(worker, "dlq-list", "--json", "--limit", "100").stdout)
    assert page["total"] == len(page["items"]) and page["total"] >= 1
    stats = json.loads(cli(worker, "dlq-stats", "--json").stdout)
    assert stats["dlq_size"] == page["total"]
    text = cli(worker, "dlq-stats").stdout
    assert "received" in text and "concurrency limit" in text
    assert all(flow["concurrency_limit"] >= 1 for flow in stats["flow"].values())
    some = next(i["request_id"] for i in page["items"] if i["request_id"].startswith(prefix))
    shown = cli(worker, "dlq-show", some)
    assert shown.returncode == 0 and some in shown.stdout and "attempts:" in shown.stdout


def test_reprocess_discard_and_status(worker):
    a, b, c = dead(worker), dead(worker), dead(worker)
    result = cli(worker, "dlq-reprocess", "--key", a, "--json")
    assert result.returncode == 0 and json.loads(result.stdout)["reprocessed"] == [a]
    wait_until(lambda: worker.get(f"/requests/{a}/")[1]["state"] == "succeeded", 30, "the replay")
    status = cli(worker, "request-status", a)
    assert status.returncode == 0 and "succeeded" in status.stdout and "reprocessed" in status.stdout
    assert cli(worker, "dlq-discard", "--key", b).returncode == 0
    assert worker.get(f"/dlq/{b}/")[0] == 404
    everything = cli(worker, "dlq-reprocess", "--all", "--error-class", "auth_error", "--rate", "50")
    assert everything.returncode == 0 and "reprocessed:" in everything.stdout and "reprocessing" in everything.stderr
    assert worker.get(f"/dlq/{c}/")[0] == 404
    d = dead(worker)  # without a rate too, in the background with its progress (not one answer that can time out)
    unpaced = cli(worker, "dlq-reprocess", "--all", "--error-class", "auth_error")
    assert unpaced.returncode == 0 and d in unpaced.stdout and "reprocessing" in unpaced.stderr


def test_errors_have_clear_messages_and_exit_codes(worker):
    missing = unique("missing")
    shown = cli(worker, "dlq-show", missing)
    assert shown.returncode == 1 and f"no dead letter with request id '{missing}'" in shown.stderr
    assert cli(worker, "dlq-reprocess", "--key", missing).returncode == 1
    assert cli(worker, "request-status", missing).returncode == 1
    usage = cli(worker, "dlq-reprocess")
    assert usage.returncode == 2 and "--key" in usage.stderr
    down = cli(worker, "dlq-stats", url="http://127.0.0.1:9")
    assert down.returncode == 3 and "cannot reach the dlqapp worker" in down.stderr and "DLQ_WEB_URL" in down.stderr
    shares = cli(worker, "generate", "--count", "5", "--fail-share", "2")
    assert shares.returncode == 2 and "--fail-share" in shares.stderr


def test_ids_with_slashes_and_dots_are_found_and_discarded(worker):
    """A request id is any string: the CLI sent `/dlq/a/../b/` unescaped and got the router's
    404, and `..` alone became `/dlq/../`, which the URL library resolved to `/`."""
    ids = [unique("team/batch") + "/../chunk%2F1?x=#y", "..", "."]
    produce(
        worker.bootstrap,
        worker.topic("input"),
        [
            (rid.encode(), request_bytes(rid, metadata={"simulate": {"fail_times": 1, "error": "auth_error"}}))
            for rid in ids
        ],
    )
    for rid in ids:
        wait_until(lambda rid=rid: cli(worker, "dlq-show", rid).returncode == 0, 30, f"{rid} in the DLQ")
        assert f"request_id   {rid}\n" in cli(worker, "dlq-show", rid).stdout
        status = cli(worker, "request-status", rid, "--json")
        assert status.returncode == 0 and json.loads(status.stdout)["request_id"] == rid
        assert json.loads(status.stdout)["state"] == "dead_lettered"
        assert cli(worker, "dlq-discard", "--key", rid, "--json").returncode == 0
        assert cli(worker, "dlq-show", rid).returncode == 1
