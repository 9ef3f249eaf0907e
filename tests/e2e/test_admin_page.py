"""The admin page in a real headless Chromium: list, filter, edit + reprocess, dry runs, layout, no script injection."""

from __future__ import annotations

import json
import math
import shutil
import subprocess

import pytest

from tests.e2e.console import CLIPPED, SCRIPT_PAYLOAD, off_loop, screenshot
from tests.kafka_io import produce, request_bytes
from tests.support import FAUST, http_json, unique, wait_until

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None, reason="needs Debian's chromium (installed by .ci/run)"
)


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker(DLQ_SIMULATED_SUCCESS_RATE="1.0")


@pytest.fixture(scope="module")
def dead(worker):
    """Five dead letters: three auth_error, one content_filter, one carrying a script."""
    plan = lambda error: {"metadata": {"simulate": {"fail_times": 1, "error": error}}}  # noqa: E731
    long_id = unique("filter") + "-rag-ingestion-batch-2026-12-02-document-chunk-000123456789"  # shown whole, never cut
    ids = {"auth": [unique("auth") for _ in range(3)], "filter": [long_id], "script": [unique("script")]}
    messages = [(rid.encode(), request_bytes(rid, **plan("auth_error"))) for rid in ids["auth"]]
    messages += [(rid.encode(), request_bytes(rid, **plan("content_filter"))) for rid in ids["filter"]]
    script_id = ids["script"][0]
    messages.append((script_id.encode(), request_bytes(script_id, prompt=SCRIPT_PAYLOAD, **plan("content_filter"))))
    produce(worker.bootstrap, worker.topic("input"), messages)
    wait_until(lambda: worker.get("/dlq/")[1]["total"] == 5, 30, "five dead letters")
    return ids


def rows(page) -> list[str]:
    return page.eval_on_selector_all("#rows tr.row", "rs => rs.map(r => r.dataset.id)")


def test_list_shows_counts_and_every_dead_letter(worker, dead, page):
    page.goto(worker.url + "/ui/")
    page.wait_for_function("document.querySelectorAll('#rows tr.row').length === 5")
    assert set(rows(page)) == {rid for ids in dead.values() for rid in ids}
    assert page.inner_text("#counts [data-class=auth_error] b") == "3"
    assert page.inner_text("#counts [data-class=content_filter] b") == "2"


def test_filter_by_error_class(worker, dead, page):
    page.goto(worker.url + "/ui/")
    page.wait_for_function("document.querySelectorAll('#rows tr.row').length === 5")
    page.select_option("#f-class", "content_filter")
    page.click("#filters button[type=submit]")
    page.wait_for_function("document.querySelectorAll('#rows tr.row').length === 2")
    assert set(rows(page)) == set(dead["filter"] + dead["script"])
    assert "1–2 of 2" in page.inner_text("#page-info")


def test_a_script_in_a_payload_is_shown_as_text_and_never_runs(worker, dead, page):
    script_id = dead["script"][0]
    page.goto(worker.url + "/ui/")
    page.click(f"#rows tr[data-id='{script_id}']")
    page.wait_for_selector("#payload-editor")
    assert json.dumps(SCRIPT_PAYLOAD)[1:-1] in page.input_value("#payload-editor")  # shown verbatim, JSON-escaped
    assert page.evaluate("window.__pwned") is None
    assert page.query_selector("#detail img") is None and page.query_selector("#detail script") is None


def test_reprocess_all_matching_asks_with_the_exact_count(worker, dead, page):
    page.goto(worker.url + "/ui/")
    page.wait_for_function("document.querySelectorAll('#rows tr.row').length >= 1")
    page.select_option("#f-class", "content_filter")
    page.click("#filters button[type=submit]")
    page.wait_for_function("document.querySelectorAll('#rows tr.row').length === 2")
    page.click("#replay-all")
    page.wait_for_selector("#confirm[open]")
    assert page.inner_text("#confirm-title") == "Reprocess all 2 dead letters with error class content_filter?"
    assert sorted(page.eval_on_selector_all("#confirm-sample li", "ls => ls.map(l => l.textContent)")) == sorted(
        dead["filter"] + dead["script"]
    )
    assert f"About {content_filter_tokens(dead)} prompt tokens" in page.inner_text("#confirm-tokens")
    screenshot(page, "reprocess-all-confirm")
    page.click("#confirm-cancel")
    assert page.is_hidden("#confirm")
    assert worker.get("/dlq/")[1]["total"] == 5  # cancelled: nothing was replayed


def content_filter_tokens(dead) -> int:
    """The documented estimate (prompt characters / 4, rounded up) of the two content_filter dead letters."""
    (fid,), (sid,) = dead["filter"], dead["script"]
    return math.ceil(len(f"hello {fid}") / 4) + math.ceil(len(SCRIPT_PAYLOAD + "\n" + f"hello {sid}") / 4)


def test_dry_run_answers_count_sample_and_tokens_and_replays_nothing(worker, dead):
    status, answer = http_json(
        worker.url + "/dlq/reprocess/", "POST", {"all": True, "error_class": "content_filter", "dry_run": True}
    )
    assert status == 200, answer
    assert answer["dry_run"] is True and answer["total"] == 2
    assert sorted(answer["sample"]) == sorted(dead["filter"] + dead["script"])
    assert answer["estimated_prompt_tokens"] == content_filter_tokens(dead) and "/ 4" in answer["estimate"]
    by_keys = http_json(worker.url + "/dlq/reprocess/", "POST", {"keys": dead["filter"], "dry_run": True})[1]
    assert (by_keys["total"], by_keys["sample"]) == (1, dead["filter"])
    assert by_keys["estimated_prompt_tokens"] == math.ceil(len(f"hello {dead['filter'][0]}") / 4)
    assert http_json(worker.url + "/dlq/reprocess/", "POST", {"all": True, "dry_run": "yes"})[0] == 400
    env = {**worker.env(), "DLQ_WEB_URL": worker.url}
    cli = subprocess.run(
        [
            str(FAUST),
            "-A",
            "dlqapp",
            "dlq-reprocess",
            "--all",
            "--error-class",
            "content_filter",
            "--dry-run",
            "--json",
        ],
        env=env,
        cwd=worker.tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    assert (
        json.loads(cli.stdout)["total"] == 2
        and json.loads(cli.stdout)["estimated_prompt_tokens"] == answer["estimated_prompt_tokens"]
    )
    assert worker.get("/dlq/")[1]["total"] == 5  # nothing was replayed


def test_headers_are_a_table_and_the_attempt_history_a_history_table(worker, dead, page):
    rid = dead["auth"][1]
    page.goto(worker.url + "/ui/")
    page.click(f"#rows tr[data-id='{rid}']")
    page.wait_for_selector("#headers tr[data-header=attempt_history] table")
    history = page.eval_on_selector_all(
        "#headers tr[data-header=attempt_history] tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.textContent))"
    )
    assert [h[0] for h in history] == ["1"] and history[0][2] == "input" and history[0][5].startswith("auth_error")
    assert page.inner_text("#headers tr[data-header=request_id] td:last-child") == rid
    assert '[{"' not in page.inner_text("#headers")  # no escaped JSON left
    screenshot(page, "dead-letter-detail")


@pytest.mark.parametrize("width", [1280, 800])
def test_nothing_is_clipped_or_behind_a_scrollbar(worker, dead, new_page, width):
    page = new_page(width, 900)
    page.goto(worker.url + "/ui/")
    page.wait_for_function("document.querySelectorAll('#rows tr.row').length === 5")
    page.click(f"#rows tr[data-id='{dead['script'][0]}']")
    page.wait_for_selector("#headers")
    assert page.evaluate(CLIPPED) == []
    lines = (
        "cs => cs.map(c => { const r = document.createRange(); r.selectNodeContents(c); "
        "return r.getClientRects().length; })"
    )
    assert set(page.eval_on_selector_all("#rows td:last-child", lines)) == {1}  # the time sits on one line
    screenshot(page, f"dead-letters-{width}")


def test_edit_then_reprocess(worker, dead, page):
    rid = dead["auth"][0]
    page.goto(worker.url + "/ui/")
    page.click(f"#rows tr[data-id='{rid}']")
    page.wait_for_selector("#payload-editor")
    page.fill("#payload-editor", f'{{"request_id": "{rid}", "prompt": "edited in the admin page"}}')
    page.click("#reprocess-edited")
    page.wait_for_function(f"!document.querySelector(\"#rows tr[data-id='{rid}']\")")
    assert "sent back to input" in page.inner_text("#toast")
    state = wait_until(
        lambda: (s := worker.get(f"/requests/{rid}/")[1]).get("state") == "succeeded" and s, 30, "the edited replay"
    )
    assert state["ledger"][0]["edited"] is True and state["ledger"][0]["by"] == "admin-page"


def test_the_list_follows_new_dead_letters_without_a_click(worker, dead, page):
    """The counts refresh every 3 s; the list must follow them, not stay as the page first
    loaded it (the demo showed '28 in the DLQ' above a list '1–16 of 16')."""
    page.goto(worker.url + "/ui/")
    page.wait_for_function("document.querySelectorAll('#rows tr.row').length > 0")
    before = set(rows(page))
    rid = unique("late")
    off_loop(
        produce,
        worker.bootstrap,
        worker.topic("input"),
        [(rid.encode(), request_bytes(rid, metadata={"simulate": {"fail_times": 1, "error": "auth_error"}}))],
    )
    page.wait_for_function(f"!!document.querySelector(\"#rows tr[data-id='{rid}']\")")
    assert set(rows(page)) == before | {rid}
    total = worker.get("/dlq/")[1]["total"]
    assert f"of {total}" in page.inner_text("#page-info")
