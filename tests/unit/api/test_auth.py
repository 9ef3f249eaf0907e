"""The HTTP guard's rules, one refusal each (dlqapp.api.auth)."""

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
