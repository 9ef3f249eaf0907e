"""The HTTP guard's rules, one refusal each (dlqapp.api.auth)."""

import asyncio

import pytest

from dlqapp.api.auth import AccessPolicy, refusal
from dlqapp.settings import Settings, SettingsError

JSON = {"Content-Type": "application/json", "Host": "127.0.0.1:6066"}
OPEN = AccessPolicy(hosts=frozenset({"dlq-worker-1"}), origins=frozenset({"https://ops.example.com"}))
TOKEN = "0123456789abcdef-token"


def test_reads_from_any_named_host_pass_and_rebinding_hosts_are_refused():
    assert refusal("GET", "10.0.0.5", {"Host": "127.0.0.1:6066"}, OPEN) is None
    assert refusal("GET", "127.0.0.1", {"Host": "localhost:6066"}, OPEN) is None
    assert refusal("GET", "127.0.0.1", {"Host": "[::1]:6066"}, OPEN) is None
    assert refusal("GET", "127.0.0.1", {"Host": "dlq-worker-1:6066"}, OPEN) is None
    status, message = refusal("GET", "127.0.0.1", {"Host": "evil.example:6066"}, OPEN)
    assert status == 403 and "DLQ_ALLOWED_HOSTS" in message


def test_mutations_need_a_json_content_type():
    for content_type in (None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        headers = {"Host": "127.0.0.1:6066", **({"Content-Type": content_type} if content_type else {})}
        status, message = refusal("POST", "127.0.0.1", headers, OPEN)
        assert status == 415 and "application/json" in message
    assert refusal("POST", "127.0.0.1", {**JSON, "Content-Type": "application/json; charset=utf-8"}, OPEN) is None
    assert refusal("OPTIONS", "127.0.0.1", {"Host": "127.0.0.1:6066"}, OPEN)[0] == 415  # no preflight is ever granted


def test_a_foreign_origin_may_not_mutate():
    status, message = refusal("POST", "127.0.0.1", {**JSON, "Origin": "http://evil.example"}, OPEN)
    assert status == 403 and "DLQ_ALLOWED_ORIGINS" in message
    assert refusal("POST", "127.0.0.1", {**JSON, "Origin": "null"}, OPEN)[0] == 403
    assert refusal("DELETE", "127.0.0.1", {**JSON, "Origin": "http://127.0.0.1:6066"}, OPEN) is None  # the page itself
    assert refusal("POST", "127.0.0.1", {**JSON, "Origin": "https://ops.example.com"}, OPEN) is None


def test_token_or_loopback():
    policy = AccessPolicy(token=TOKEN)
    assert refusal("POST", "10.0.0.5", JSON, policy)[0] == 401
    assert refusal("POST", "10.0.0.5", {**JSON, "Authorization": "Bearer wrong"}, policy)[0] == 403
    assert refusal("POST", "10.0.0.5", {**JSON, "Authorization": f"Bearer {TOKEN}"}, policy) is None
    status, message = refusal("POST", "10.0.0.5", JSON, OPEN)
    assert status == 403 and "DLQ_ADMIN_TOKEN" in message
    assert refusal("POST", "127.0.0.1", JSON, OPEN) is None


def test_a_short_admin_token_is_refused_naming_the_setting():
    with pytest.raises(SettingsError, match="DLQ_ADMIN_TOKEN"):
        Settings.from_env({"DLQ_ADMIN_TOKEN": "change-me"})
    assert Settings.from_env({"DLQ_ADMIN_TOKEN": TOKEN}).admin_token == TOKEN
    assert Settings.from_env({}).admin_token == ""


def test_probes_answer_any_host_but_only_for_reads():
    policy = AccessPolicy(token=TOKEN)
    for path in ("/livez", "/readyz"):
        assert refusal("GET", "10.0.0.5", {"Host": "evil.example:6066"}, policy, path) is None
        assert refusal("GET", "10.0.0.5", {"Host": "dlqapp.prod.svc:6066"}, policy, path) is None
        assert refusal("GET", "10.0.0.5", {}, policy, path) is None
        assert refusal("POST", "10.0.0.5", {"Host": "evil.example:6066"}, policy, path)[0] == 403
    # every other route still checks the Host, /livez/ and /readyz/x included
    for path in ("/", "/dlq/", "/metrics", "/livez/", "/readyz/x"):
        assert refusal("GET", "10.0.0.5", {"Host": "evil.example:6066"}, policy, path)[0] == 403


def test_a_delete_without_body_needs_no_content_type_when_it_carries_the_right_token():
    policy = AccessPolicy(token=TOKEN)
    bearer = {"Host": "10.0.0.9:6066", "Authorization": f"Bearer {TOKEN}"}
    assert refusal("DELETE", "10.0.0.5", bearer, policy) is None
    assert refusal("DELETE", "10.0.0.5", {**bearer, "Content-Length": "0"}, policy) is None
    assert refusal("DELETE", "10.0.0.5", {**bearer, "Content-Type": "text/plain"}, policy) is None  # no body to type
    # a body still needs its type, a POST still needs it, and so does a wrong or missing token
    assert refusal("DELETE", "10.0.0.5", {**bearer, "Content-Length": "12"}, policy)[0] == 415
    assert refusal("DELETE", "10.0.0.5", {**bearer, "Transfer-Encoding": "chunked"}, policy)[0] == 415
    assert refusal("POST", "10.0.0.5", bearer, policy)[0] == 415
    assert refusal("DELETE", "10.0.0.5", {**bearer, "Authorization": "Bearer wrong-token-0123456789"}, policy)[0] == 415
    assert refusal("DELETE", "10.0.0.5", {"Host": "10.0.0.9:6066"}, policy)[0] == 415
    # the other rules hold: a foreign origin is refused, and the right token with JSON still passes
    assert refusal("DELETE", "10.0.0.5", {**bearer, "Origin": "http://evil.example"}, policy)[0] == 403
    assert refusal("DELETE", "10.0.0.5", {**bearer, **JSON}, policy) is None


def test_token_less_mutations_from_loopback_keep_every_browser_protection():
    no_type = {"Host": "127.0.0.1:6066"}
    assert refusal("DELETE", "127.0.0.1", no_type, OPEN)[0] == 415  # what a page on this machine could forge
    assert refusal("DELETE", "127.0.0.1", {**no_type, "Authorization": "Bearer anything-at-all-12345"}, OPEN)[0] == 415
    assert refusal("DELETE", "127.0.0.1", {**JSON, "Origin": "http://evil.example"}, OPEN)[0] == 403
    assert refusal("DELETE", "127.0.0.1", JSON, OPEN) is None


def test_the_middleware_applies_the_rules_to_real_requests():
    """Through aiohttp: what a client really sends (a DELETE without body has no Content-Type)."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from dlqapp.api.auth import guard_middleware

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def main() -> list[int]:
        app = web.Application(middlewares=[guard_middleware(AccessPolicy(token=TOKEN))])
        app.router.add_route("*", "/dlq/{id}/", ok)
        app.router.add_get("/readyz", ok)
        async with TestClient(TestServer(app)) as client:
            bearer = {"Authorization": f"Bearer {TOKEN}"}
            return [
                (await client.delete("/dlq/a/", headers=bearer)).status,
                (await client.delete("/dlq/a/", headers=bearer, data=b"x=1")).status,
                (await client.delete("/dlq/a/")).status,
                (await client.get("/readyz", headers={"Host": "evil.example"})).status,
                (await client.get("/dlq/a/", headers={"Host": "evil.example"})).status,
            ]

    assert asyncio.run(main()) == [200, 415, 415, 200, 403]
