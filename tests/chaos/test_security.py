"""Security: who may mutate (a bearer token when DLQ_ADMIN_TOKEN is set, else loopback
clients only), oversized bodies (413). Script injection into the admin page is covered in
tests/e2e/test_admin_page.py, in a real browser."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request

import pytest

from tests.support import http_json, unique

NETNS = "dlqapp-auth-test"
HOST_IP, CLIENT_IP = "169.254.77.1", "169.254.77.2"


def call(url: str, method: str = "POST", token: str | None = None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return http_json(url, method, {} if method == "POST" else None, headers=headers)


def test_token_is_required_and_checked(make_worker):
    worker = make_worker(env_extra={"DLQ_ADMIN_TOKEN": "s3cret-token-0123456789"}).start()
    target = f"{worker.url}/dlq/{unique('x')}/reprocess/"
    status, body = call(target)
    assert status == 401 and "Bearer" in body["error"]
    assert call(target, token="wrong")[0] == 403
    assert call(target, token="s3cret-token-0123456789")[0] == 404  # allowed through; the id is unknown
    assert call(f"{worker.url}/dlq/x/", "DELETE", token="nope")[0] == 403
    assert http_json(worker.url + "/dlq/")[0] == 200  # reads need no token
    assert http_json(worker.url + "/table/requests/")[0] == 404  # Faust's raw table views are off
    big = urllib.request.Request(
        f"{worker.url}/dlq/reprocess/",
        data=b"x" * 5_000_000,
        method="POST",
        headers={"Authorization": "Bearer s3cret-token-0123456789", "Content-Type": "application/json"},
    )
    try:
        urllib.request.urlopen(big, timeout=10)
        raise AssertionError("a 5 MB body must be refused")
    except urllib.error.HTTPError as exc:
        assert exc.code == 413 and "DLQ_MAX_BODY_BYTES" in json.loads(exc.read())["error"]


@pytest.fixture
def netns():
    """A network namespace with a veth pair: a client that is not on loopback."""
    if shutil.which("ip") is None or subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        pytest.skip("needs iproute2 and root for a network namespace")
    run = lambda *args: subprocess.run(args, check=True, capture_output=True)  # noqa: E731
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
    subprocess.run(["ip", "link", "del", "dlqauth0"], capture_output=True)
    run("ip", "netns", "add", NETNS)
    try:
        run("ip", "link", "add", "dlqauth0", "type", "veth", "peer", "name", "dlqauth1")
        run("ip", "link", "set", "dlqauth1", "netns", NETNS)
        run("ip", "addr", "add", f"{HOST_IP}/30", "dev", "dlqauth0")
        run("ip", "link", "set", "dlqauth0", "up")
        run("ip", "netns", "exec", NETNS, "ip", "addr", "add", f"{CLIENT_IP}/30", "dev", "dlqauth1")
        run("ip", "netns", "exec", NETNS, "ip", "link", "set", "dlqauth1", "up")
        yield NETNS
    finally:
        subprocess.run(["ip", "link", "del", "dlqauth0"], capture_output=True)
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)


def from_netns(namespace: str, url: str, method: str) -> tuple[int, dict]:
    script = (
        "import json, sys, urllib.request\n"
        f"r = urllib.request.Request({url!r}, data=b'{{}}' if {method!r} == 'POST' else None, method={method!r}, "
        "headers={'Content-Type': 'application/json'})\n"
        "try:\n    resp = urllib.request.urlopen(r, timeout=10); print(resp.status); print(resp.read().decode())\n"
        "except urllib.error.HTTPError as e:\n    print(e.code); print(e.read().decode())\n"
    )
    out = subprocess.run(
        ["ip", "netns", "exec", namespace, "python3", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    status, body = out.split("\n", 1)
    return int(status), json.loads(body)


def test_without_a_token_only_loopback_clients_may_mutate(make_worker, netns):
    worker = make_worker(env_extra={"DLQ_WEB_HOST": "0.0.0.0"}).start()
    remote = f"http://{HOST_IP}:{worker.web_port}"
    status, body = from_netns(netns, f"{remote}/dlq/{unique('x')}/reprocess/", "POST")
    assert status == 403 and "DLQ_ADMIN_TOKEN" in body["error"]
    assert from_netns(netns, f"{remote}/dlq/x/", "DELETE")[0] == 403
    assert from_netns(netns, f"{remote}/dlq/", "GET")[0] == 200
    assert call(f"{worker.url}/dlq/{unique('x')}/reprocess/")[0] == 404  # loopback: allowed through


def test_a_web_page_cannot_make_the_browser_replay_or_read_the_dlq(make_worker):
    """Cross-site requests and DNS rebinding against a worker without a token (the default)."""
    worker = make_worker().start()
    bulk = f"{worker.url}/dlq/reprocess/"
    status, body = http_json(
        bulk, "POST", raw=b'{"all": true}', headers={"Content-Type": "text/plain", "Origin": "http://evil.example"}
    )
    assert status == 415 and "application/json" in body["error"]
    status, body = http_json(bulk, "POST", {"all": True}, headers={"Origin": "http://evil.example"})
    assert status == 403 and "DLQ_ALLOWED_ORIGINS" in body["error"]
    status, body = http_json(f"{worker.url}/dlq/", headers={"Host": "rebound.evil.example"})
    assert status == 403 and "DLQ_ALLOWED_HOSTS" in body["error"]
    assert (
        http_json(f"{worker.url}/dlq/x/", "DELETE", headers={"Host": f"rebound.evil.example:{worker.web_port}"})[0]
        == 403
    )
    status, body = http_json(bulk, "POST", {"all": True}, headers={"Origin": worker.url})
    assert status == 200 and body["reprocessed"] == []  # its own page may


def test_an_allowed_host_and_origin_are_accepted(make_worker):
    worker = make_worker(
        env_extra={"DLQ_ALLOWED_HOSTS": "dlq.internal", "DLQ_ALLOWED_ORIGINS": "https://ops.example.com"}
    ).start()
    assert http_json(f"{worker.url}/dlq/", headers={"Host": "dlq.internal"})[0] == 200
    status, _ = http_json(
        f"{worker.url}/dlq/reprocess/", "POST", {"keys": ["nope"]}, headers={"Origin": "https://ops.example.com"}
    )
    assert status == 200


def test_a_short_token_stops_the_worker_naming_the_setting(make_worker):
    worker = make_worker(env_extra={"DLQ_ADMIN_TOKEN": "change-me"})
    worker.start(wait=False)
    assert worker.process.wait(timeout=60) != 0
    assert "DLQ_ADMIN_TOKEN" in worker.log_path.read_text()
