"""The admin page in a real headless Chromium: list, filter, edit + reprocess, no script injection."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.support import Worker, produce, request_bytes, unique, wait_until

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCRIPT_PAYLOAD = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'

pytestmark = pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (installed by .ci/run)")


@pytest.fixture(scope="module")
def worker(kafka_bootstrap, tmp_path_factory):
    w = Worker(kafka_bootstrap, tmp_path_factory.mktemp("ui"), env_extra={"DLQ_SIMULATED_SUCCESS_RATE": "1.0"})
    w.start()
    yield w
    w.kill()


@pytest.fixture(scope="module")
def dead(worker):
    """Five dead letters: three auth_error, one content_filter, one carrying a script."""
    plan = lambda error: {"metadata": {"simulate": {"fail_times": 1, "error": error}}}  # noqa: E731
    ids = {"auth": [unique("auth") for _ in range(3)], "filter": [unique("filter")], "script": [unique("script")]}
    messages = [(rid.encode(), request_bytes(rid, **plan("auth_error"))) for rid in ids["auth"]]
    messages += [(rid.encode(), request_bytes(rid, **plan("content_filter"))) for rid in ids["filter"]]
    script_id = ids["script"][0]
    messages.append((script_id.encode(), request_bytes(script_id, prompt=SCRIPT_PAYLOAD, **plan("content_filter"))))
    produce(worker.bootstrap, worker.topic("input"), messages)
    wait_until(lambda: worker.get("/dlq/")[1]["total"] == 5, 30, "five dead letters")
    return ids


@pytest.fixture
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page()
        page.set_default_timeout(15_000)
        yield page
        browser.close()


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
    with page.expect_event("dialog") as dialog_info:
        page.click("#replay-all", no_wait_after=True)  # the confirm dialog blocks the page until handled
    dialog = dialog_info.value
    assert dialog.message == "Reprocess all 2 dead letters with error class content_filter?"
    dialog.dismiss()
    assert worker.get("/dlq/")[1]["total"] == 5  # dismissed: nothing was replayed


def test_edit_then_reprocess(worker, dead, page):
    rid = dead["auth"][0]
    page.goto(worker.url + "/ui/")
    page.click(f"#rows tr[data-id='{rid}']")
    page.wait_for_selector("#payload-editor")
    page.fill("#payload-editor", f'{{"request_id": "{rid}", "prompt": "edited in the admin page"}}')
    page.click("#reprocess-edited")
    page.wait_for_function(f"!document.querySelector(\"#rows tr[data-id='{rid}']\")")
    assert "sent back to input" in page.inner_text("#toast")
    state = wait_until(lambda: (s := worker.get(f"/requests/{rid}/")[1]).get("state") == "succeeded" and s, 30, "the edited replay")
    assert state["ledger"][0]["edited"] is True and state["ledger"][0]["by"] == "admin-page"
