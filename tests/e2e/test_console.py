"""The operator console against one real worker on the mock LLM: health, retries, lookup.

One worker for the module (openai backend on dlqapp-mock-llm, breaker on, retries parked
for ten minutes so they wait for an operator). The stalled case runs last: a mock outage
must raise the banner and recovery must clear it. The breaker stays open 6 s, long enough
for the page (it polls every 3 s) to see requests held; a held request that probes and fails
moves on to a retry tier (dlqapp.core.breaker), so with shorter pauses the stall is brief.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from urllib.parse import quote

import pytest

from tests.e2e.console import CLIPPED, off_loop, screenshot
from tests.kafka_io import produce, request_bytes
from tests.support import FAUST, MockLLM, http_json, unique, wait_until

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None, reason="needs Debian's chromium (installed by .ci/run)"
)

XSS_ERROR = '<img src=x onerror="window.__pwned=3"><script>window.__pwned=4</script>'


@pytest.fixture(scope="module")
def mock(tmp_path_factory):
    m = MockLLM(tmp_path_factory.mktemp("console-mock"), args=["--latency-ms", "5", "--jitter-ms", "0"]).start()
    yield m
    m.stop()


@pytest.fixture(scope="module")
def worker(mock, start_worker):
    return start_worker(
        DLQ_INFERENCE="openai",
        DLQ_INFERENCE_URL=mock.api_url,
        DLQ_INFERENCE_TIMEOUT="2s",
        DLQ_RETRY_DELAYS="10m,20m",
        DLQ_BREAKER="true",
        DLQ_BREAKER_WINDOW="4s",
        DLQ_BREAKER_CONSECUTIVE="4",
        DLQ_BREAKER_MIN_CALLS="4",
        DLQ_BREAKER_OPEN="6s",
        DLQ_BREAKER_MAX_OPEN="6s",
        DLQ_BREAKER_PROBES="1",
    )


def park(worker, mock, prefix: str, count: int, message: str = "mock: a teapot") -> list[str]:
    """`count` requests whose first call fails with a retryable, not backend-wide error (HTTP 418 → unknown)."""
    ids = [f"{unique(prefix)}-{i}" for i in range(count)]
    for rid in ids:
        mock.plan(
            request_id=rid, fail_times=1, status=418, error={"type": "error", "code": "teapot", "message": message}
        )
    off_loop(produce, worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid)) for rid in ids])
    wait_until(
        lambda: all(worker.get(f"/requests/{rid}/")[1].get("state") == "retry_scheduled" for rid in ids),
        30,
        f"{count} parked retries",
    )
    return ids


def listed(worker, **params) -> dict:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    status, body = worker.get(f"/retries/?{query}")
    assert status == 200, body
    return body


def cli(worker, *args):
    env = {**worker.env(), "DLQ_WEB_URL": worker.url}
    return subprocess.run(
        [str(FAUST), "-A", "dlqapp", *args], env=env, cwd=worker.tmp, capture_output=True, text=True, timeout=120
    )


def post(worker, path, headers=None, raw=None):
    return http_json(worker.url + path, "POST", {} if raw is None else None, raw=raw, headers=headers)


# -- HTTP and CLI ------------------------------------------------------------------------


def test_retries_list_filters_pages_and_counts_exactly(worker, mock):
    ids = park(worker, mock, "list", 3)
    page = listed(worker, limit=2)
    assert page["total"] >= 3 and len(page["items"]) == 2
    mine = [i for i in listed(worker, limit=1000)["items"] if i["request_id"] in ids]
    assert sorted(i["request_id"] for i in mine) == sorted(ids)
    for item in mine:
        assert set(item) >= {"request_id", "tier", "attempt", "due_at", "error_class", "last_error"}
        assert (item["tier"], item["attempt"], item["error_class"]) == ("retry-10m", 2, "unknown") and "teapot" in item[
            "last_error"
        ]
    total = listed(worker)["total"]
    assert listed(worker, tier="retry-10m")["total"] == total == listed(worker)["by_tier"]["retry-10m"]
    assert listed(worker, tier="retry-20m")["total"] == 0
    assert (
        listed(worker, error_class="unknown")["total"] == total and listed(worker, error_class="timeout")["total"] == 0
    )
    dues = [i["due_at"] for i in listed(worker, limit=1000)["items"]]
    assert dues == sorted(dues)  # earliest due first
    assert listed(worker, limit=1, offset=1)["items"][0] == listed(worker, limit=2)["items"][1]
    assert worker.get("/retries/?limit=x")[0] == 400
    shown = cli(worker, "dlq-retries", "--tier", "retry-10m", "--limit", "1000")
    assert shown.returncode == 0, shown.stderr
    assert all(rid in shown.stdout for rid in ids) and f"of {total} parked retries" in shown.stdout


def test_run_now_attempts_early_like_the_timer_and_is_in_the_ledger(worker, mock):
    rid = park(worker, mock, "runnow", 1)[0]
    due = next(i["due_at"] for i in listed(worker, limit=1000)["items"] if i["request_id"] == rid)
    result = cli(worker, "retry-now", "--key", rid, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0]["status"] == "fired"
    state = wait_until(
        lambda: (s := worker.get(f"/requests/{rid}/")[1]).get("state") == "succeeded" and s,
        30,
        "the early retry to succeed",
    )
    assert mock.calls(rid) == 2  # one failed first attempt, one early retry: no extra call
    second = state["history"][-1]
    assert second["state"] == "succeeded" and second["at"] < due  # it ran before its due time
    ledger = state["ledger"]
    assert (
        [r["action"] for r in ledger] == ["run_now"]
        and ledger[0]["tier"] == "retry-10m"
        and ledger[0]["by"].startswith("cli:")
    )
    assert rid not in {i["request_id"] for i in listed(worker, limit=1000)["items"]}
    again = post(worker, f"/retries/{rid}/run-now/")
    assert again[0] == 404 and again[1]["status"] == "not_found"


def test_dead_letter_now_moves_it_to_the_dlq_with_its_history(worker, mock):
    rid = park(worker, mock, "dlnow", 1)[0]
    status, answer = post(worker, f"/retries/{rid}/dead-letter/", headers={"X-DLQ-Actor": "ops-test"})
    assert status == 200 and answer["status"] == "dead_lettered", answer
    # the dlq agent files the dead letter once it reads it back from the topic
    entry = wait_until(lambda: (lambda got: got[0] == 200 and got[1])(worker.get(f"/dlq/{rid}/")), 30, "its DLQ entry")
    assert entry["error_class"] == "unknown"
    assert [a["attempt"] for a in entry["history"]] == [1] and "teapot" in entry["history"][0]["error"]
    assert "dead-lettered by ops-test" in entry["final_error"]
    assert entry["ledger"][-1]["action"] == "dead_letter_now"
    assert rid not in {i["request_id"] for i in listed(worker, limit=1000)["items"]}
    assert worker.get(f"/requests/{rid}/")[1]["state"] == "dead_lettered"
    assert mock.calls(rid) == 1  # never attempted again
    assert post(worker, f"/retries/{rid}/dead-letter/")[0] == 404


def test_retry_mutations_go_through_the_access_policy(worker, mock):
    rid = park(worker, mock, "guard", 1)[0]
    assert post(worker, f"/retries/{rid}/run-now/", headers={"Content-Type": "text/plain"})[0] == 415
    assert post(worker, f"/retries/{rid}/dead-letter/", headers={"Origin": "http://evil.example"})[0] == 403
    assert post(worker, f"/retries/{rid}/run-now/", headers={"Host": "evil.example"})[0] == 403
    assert rid in {i["request_id"] for i in listed(worker, limit=1000)["items"]}  # nothing happened


def test_health_counts_per_minute_and_names_parked_tiers(worker, mock):
    status, health = worker.get("/health/")
    assert status == 200 and health["status"] == "ok" and health["alerts"] == []
    total = health["total"]
    assert len(total["series"]) == 15
    assert sum(p["received"] for p in total["series"]) >= 6 and sum(p["retried"] for p in total["series"]) >= 6
    assert total["parked_by_tier"]["retry-10m"] == listed(worker)["total"]
    assert total["next_due_by_tier"]["retry-10m"] == listed(worker, limit=1)["items"][0]["due_at"]
    (only,) = health["workers"]
    assert only["breaker"]["state"] == "closed" and only["url"].rstrip("/") == worker.url


# -- the page ------------------------------------------------------------------------------


def test_retries_tab_runs_now_and_dead_letters_selected_without_running_scripts(worker, mock, page):
    xss_id = f"xss-<img src=x onerror=window.__pwned=5>-{uuid.uuid4().hex[:8]}"
    ids = park(worker, mock, "page", 3, message=XSS_ERROR)
    mock.plan(
        request_id=xss_id, fail_times=1, status=418, error={"type": "error", "code": "teapot", "message": XSS_ERROR}
    )
    off_loop(produce, worker.bootstrap, worker.topic("input"), [(xss_id.encode(), request_bytes(xss_id))])
    wait_until(
        lambda: any(i["request_id"] == xss_id for i in listed(worker, limit=1000)["items"]),
        30,
        "the script-named retry",
    )
    page.goto(worker.url + "/ui/")
    page.click("#tab-retries")
    row = lambda rid: f"#r-rows tr[data-id={json.dumps(rid)}]"  # noqa: E731
    page.wait_for_selector(row(xss_id))
    assert page.inner_text(row(xss_id) + " td:nth-child(2)") == xss_id  # shown as text
    assert XSS_ERROR in page.inner_text(row(ids[0]) + " .last-error")
    screenshot(page, "retries")
    page.click(row(ids[0]) + " button.run-now")
    page.wait_for_function(f"!document.querySelector({json.dumps(row(ids[0]))})")
    wait_until(lambda: worker.get(f"/requests/{ids[0]}/")[1].get("state") == "succeeded", 30, "run now from the page")
    page.check(row(ids[1]) + " input[type=checkbox]")
    page.check(row(xss_id) + " input[type=checkbox]")
    page.click("#r-dead-selected")
    page.wait_for_selector("#confirm[open]")
    screenshot(page, "retries-dead-letter-confirm")
    page.click("#confirm-ok")
    # the toast comes once both answers are in (the page's periodic refresh may drop the
    # rows earlier, while the last answer waits for its write to commit)
    page.wait_for_function("document.querySelector('#toast').textContent.includes('dead-lettered')")
    assert page.inner_text("#toast") == "2 dead-lettered"
    page.wait_for_function(
        f"!document.querySelector({json.dumps(row(ids[1]))}) && !document.querySelector({json.dumps(row(xss_id))})"
    )
    for rid in (ids[1], xss_id):
        # the dlq agent records the entry once it reads the dead letter (committed) back
        status, entry = wait_until(
            lambda rid=rid: (r := worker.get(f"/dlq/{quote(rid, safe='')}/"))[0] == 200 and r,
            30,
            f"the dead letter of {rid}",
        )
        assert status == 200 and (entry["ledger"][-1]["action"], entry["ledger"][-1]["by"]) == (
            "dead_letter_now",
            "admin-page",
        )
    assert page.evaluate("window.__pwned") is None
    assert page.query_selector("#r-rows img, #r-rows script") is None
    # the lookup of the script-named request shows its timeline, still as text
    page.fill("#lookup-id", xss_id)
    page.click("#lookup-form button[type=submit]")
    page.wait_for_selector("#lookup-attempts tbody tr")
    assert page.inner_text("#lookup-result h2") == xss_id and page.inner_text("#lookup-state") == "dead_lettered"
    assert XSS_ERROR in page.inner_text("#lookup-attempts")
    assert "dead-lettered now by admin-page" in page.inner_text("#lookup-result .ledger")
    assert (
        page.evaluate("window.__pwned") is None
        and page.query_selector("#lookup-result img, #lookup-result script") is None
    )


def test_lookup_shows_the_attempt_timeline_scheduled_vs_actual(worker, mock, page):
    rid = park(worker, mock, "lookup", 1)[0]
    assert (
        post(worker, f"/retries/{rid}/run-now/", headers={"X-DLQ-Actor": XSS_ERROR})[1]["status"] == "fired"
    )  # the actor is shown too
    wait_until(lambda: worker.get(f"/requests/{rid}/")[1].get("state") == "succeeded", 30, "the early retry")
    page.goto(worker.url + "/ui/")
    page.fill("#lookup-id", rid)
    page.press("#lookup-id", "Enter")
    page.wait_for_selector("#lookup-states tbody tr")
    assert page.inner_text("#lookup-state") == "succeeded"
    states = page.inner_text("#lookup-states")
    assert "retry_scheduled" in states and "succeeded" in states
    assert f"run now by {XSS_ERROR}" in page.inner_text("#lookup-result .ledger")
    attempts = page.eval_on_selector_all(
        "#lookup-attempts tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.textContent))"
    )
    assert [a[0] for a in attempts] == ["1", "2"]
    assert attempts[0][5].startswith("unknown") and "teapot" in attempts[0][5] and attempts[1][5] == "ok"
    assert attempts[0][2] == "input" and attempts[1][2] == "retry-10m"
    assert attempts[1][1].endswith(" early")  # run now: before its scheduled time
    assert (
        page.evaluate("window.__pwned") is None
        and page.query_selector("#lookup-result img, #lookup-result script") is None
    )
    screenshot(page, "lookup")
    page.fill("#lookup-id", "no-such-" + uuid.uuid4().hex)
    page.press("#lookup-id", "Enter")
    page.wait_for_function("document.querySelector('#lookup-state').textContent.includes('unknown request id')")


@pytest.mark.parametrize("width", [1280, 800])
def test_health_panel_and_nothing_clipped(worker, mock, new_page, width):
    park(worker, mock, f"layout{width}-rag-ingestion-batch-2026-12-02-document-chunk", 1)  # a long id is shown whole
    page = new_page(width, 900)
    errors: list[str] = []  # what the browser's console would show an operator (a failed load too)
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(worker.url + "/ui/")
    page.wait_for_selector("#health-total .tile")
    page.wait_for_selector("#workers tbody tr")
    assert errors == []
    assert int(page.inner_text("#health-total [data-metric=parked] .v")) == listed(worker)["total"]
    assert page.eval_on_selector_all("#chart polyline", "ls => ls.map(l => l.dataset.series)") == [
        "received",
        "succeeded",
        "retried",
        "dead_lettered",
    ]
    assert page.is_hidden("#banner")
    assert page.evaluate(CLIPPED) == []
    screenshot(page, f"health-{width}")
    page.click("#tab-retries")
    page.wait_for_selector("#r-rows tr.row")
    assert page.evaluate(CLIPPED) == []
    # A retry due on another day shows a date, the longest form: it must fit too.
    page.evaluate(
        "document.querySelectorAll('#r-rows td.due .abs').forEach((n) => { n.textContent = 'Dec 31 23:59'; })"
    )
    assert page.evaluate(CLIPPED) == []
    screenshot(page, f"retries-{width}")


def test_a_stalled_worker_raises_the_banner_and_recovery_clears_it(worker, mock, page):
    page.goto(worker.url + "/ui/")
    page.wait_for_selector("#health-total .tile")
    assert page.is_hidden("#banner")
    mock.outage(True)
    try:
        ids = [unique("stall") for _ in range(8)]
        off_loop(produce, worker.bootstrap, worker.topic("input"), [(rid.encode(), request_bytes(rid)) for rid in ids])
        try:
            page.wait_for_selector("#banner .alert", state="visible", timeout=60_000)
        except Exception as exc:
            raise AssertionError(
                f"no banner; /health/ says {worker.get('/health/')[1]}; states "
                f"{[worker.get(f'/requests/{rid}/')[1].get('state') for rid in ids]}"
            ) from exc
        text = page.inner_text("#banner")
        assert "Stalled" in text and "circuit breaker" in text and "requests held" in text
        screenshot(page, "stalled")
    finally:
        mock.outage(False)
    page.wait_for_selector("#banner", state="hidden", timeout=60_000)
    # the requests that failed before the breaker opened wait in a retry tier; the held ones succeed
    settled = lambda: [worker.get(f"/requests/{rid}/")[1].get("state") for rid in ids]  # noqa: E731
    wait_until(
        lambda: set(settled()) <= {"succeeded", "retry_scheduled"} and "succeeded" in settled(),
        60,
        "the held requests after recovery",
    )
    screenshot(page, "recovered")
