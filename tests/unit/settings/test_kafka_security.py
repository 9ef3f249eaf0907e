"""Kafka client security settings, ACLs and the start-up diagnosis (no broker needed)."""

from __future__ import annotations

import subprocess

import pytest

from dlqapp.kafka.access import explain
from dlqapp.kafka.acls import TOPIC_OPS, Operation, kafka_acls_lines, missing, required
from dlqapp.settings import Settings, SettingsError
from dlqapp.settings.kafka_security import KafkaSecurity, Secret


@pytest.fixture(scope="module")
def pems(tmp_path_factory):
    """A CA and a client certificate signed by it (openssl, as scripts/kafka-local makes them)."""
    d = tmp_path_factory.mktemp("pem")
    run = lambda *a: subprocess.run(a, cwd=d, check=True, capture_output=True)  # noqa: E731
    run(
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=test CA",
    )
    run(
        "openssl",
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
        "-subj",
        "/CN=dlqapp",
    )
    run(
        "openssl",
        "x509",
        "-req",
        "-in",
        "client.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "client.pem",
        "-days",
        "2",
    )
    (d / "password").write_text("s3cret-from-a-file\n")
    (d / "empty").write_text("")
    return d


def settings(**env: str) -> Settings:
    return Settings.from_env(env)


def refused(**env: str) -> str:
    with pytest.raises(SettingsError) as err:
        settings(**env)
    return str(err.value)


def test_plaintext_is_the_default_and_needs_nothing():
    s = settings()
    assert s.kafka_client() == {"bootstrap_servers": "127.0.0.1:9092", "security_protocol": "PLAINTEXT"}
    assert s.kafka_security.faust_credentials() is None


def test_sasl_ssl_with_scram_and_a_password_file(pems):
    s = settings(
        DLQ_KAFKA_SECURITY_PROTOCOL="sasl_ssl",
        DLQ_KAFKA_SASL_MECHANISM="scram-sha-512",
        DLQ_KAFKA_SASL_USERNAME="dlqapp",
        DLQ_KAFKA_SASL_PASSWORD_FILE=str(pems / "password"),
        DLQ_KAFKA_SSL_CAFILE=str(pems / "ca.pem"),
    )
    options = s.kafka_client()
    assert options["security_protocol"] == "SASL_SSL" and options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert options["sasl_plain_password"] == "s3cret-from-a-file"  # the trailing newline of the file is dropped
    assert options["ssl_context"].check_hostname is True
    credentials = s.kafka_security.faust_credentials()
    assert credentials.protocol.value == "SASL_SSL" and credentials.mechanism.value == "SCRAM-SHA-512"
    assert s.kafka_security.describe() == "SASL_SSL SCRAM-SHA-512 as dlqapp"


def test_mutual_tls_loads_the_client_certificate_and_hostname_checks_can_be_turned_off(pems):
    s = settings(
        DLQ_KAFKA_SECURITY_PROTOCOL="SSL",
        DLQ_KAFKA_SSL_CAFILE=str(pems / "ca.pem"),
        DLQ_KAFKA_SSL_CERTFILE=str(pems / "client.pem"),
        DLQ_KAFKA_SSL_KEYFILE=str(pems / "client.key"),
        DLQ_KAFKA_SSL_CHECK_HOSTNAME="false",
    )
    assert s.kafka_client()["ssl_context"].check_hostname is False
    assert s.kafka_security.faust_credentials().protocol.value == "SSL"
    assert (
        "client certificate" in s.kafka_security.describe()
        and "without hostname verification" in s.kafka_security.describe()
    )


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"DLQ_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "DLQ_KAFKA_SASL_MECHANISM is required"),
        (
            {"DLQ_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "DLQ_KAFKA_SASL_MECHANISM": "PLAIN"},
            "DLQ_KAFKA_SASL_USERNAME is required",
        ),
        (
            {
                "DLQ_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "DLQ_KAFKA_SASL_MECHANISM": "PLAIN",
                "DLQ_KAFKA_SASL_USERNAME": "u",
            },
            "DLQ_KAFKA_SASL_PASSWORD or DLQ_KAFKA_SASL_PASSWORD_FILE is required",
        ),
        (
            {"DLQ_KAFKA_SASL_MECHANISM": "PLAIN"},
            "DLQ_KAFKA_SASL_MECHANISM is set but DLQ_KAFKA_SECURITY_PROTOCOL=PLAINTEXT",
        ),
        (
            {"DLQ_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "DLQ_KAFKA_SASL_MECHANISM": "GSSAPI"},
            "DLQ_KAFKA_SASL_MECHANISM='GSSAPI' is invalid",
        ),
        ({"DLQ_KAFKA_SECURITY_PROTOCOL": "TLS"}, "DLQ_KAFKA_SECURITY_PROTOCOL='TLS' is invalid"),
        (
            {"DLQ_KAFKA_SECURITY_PROTOCOL": "SSL", "DLQ_KAFKA_SSL_CAFILE": "/no/such/ca.pem"},
            "DLQ_KAFKA_SSL_CAFILE=/no/such/ca.pem: no such file",
        ),
        ({"DLQ_KAFKA_SSL_CAFILE": "/etc/hostname"}, "uses no TLS"),
        (
            {"DLQ_KAFKA_SECURITY_PROTOCOL": "SSL", "DLQ_KAFKA_SSL_CERTFILE": "/etc/hostname"},
            "DLQ_KAFKA_SSL_CERTFILE and DLQ_KAFKA_SSL_KEYFILE go together",
        ),
    ],
)
def test_inconsistent_settings_are_refused_naming_the_setting(env, named):
    assert named in refused(**env)


def test_files_are_checked_at_start(pems):
    sasl = {
        "DLQ_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "DLQ_KAFKA_SASL_MECHANISM": "PLAIN",
        "DLQ_KAFKA_SASL_USERNAME": "u",
    }
    assert "is empty" in refused(**sasl, DLQ_KAFKA_SASL_PASSWORD_FILE=str(pems / "empty"))
    assert "not both" in refused(
        **sasl, DLQ_KAFKA_SASL_PASSWORD="x", DLQ_KAFKA_SASL_PASSWORD_FILE=str(pems / "password")
    )
    assert "not a PEM CA certificate" in refused(
        DLQ_KAFKA_SECURITY_PROTOCOL="SSL", DLQ_KAFKA_SSL_CAFILE=str(pems / "password")
    )
    assert "not a PEM certificate and its key" in refused(
        DLQ_KAFKA_SECURITY_PROTOCOL="SSL",
        DLQ_KAFKA_SSL_CERTFILE=str(pems / "client.pem"),
        DLQ_KAFKA_SSL_KEYFILE=str(pems / "ca.key"),
    )


def test_a_password_never_shows_in_settings_errors_or_descriptions():
    s = settings(
        DLQ_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT",
        DLQ_KAFKA_SASL_MECHANISM="PLAIN",
        DLQ_KAFKA_SASL_USERNAME="u",
        DLQ_KAFKA_SASL_PASSWORD="hunter2-hunter2",
    )
    for text in (repr(s), str(s.kafka_sasl_password), repr(s.kafka_security), s.kafka_security.describe()):
        assert "hunter2" not in text
    assert s.kafka_sasl_password.reveal() == "hunter2-hunter2" and Secret("a") == Secret("a")
    message = refused(DLQ_KAFKA_SASL_PASSWORD="hunter2-hunter2")  # set without SASL
    assert "hunter2" not in message and "DLQ_KAFKA_SASL_PASSWORD is set" in message


def test_acls_are_least_privilege_and_follow_the_settings():
    s = settings(DLQ_APP_ID="billing", DLQ_TOPIC_PREFIX="prod.", DLQ_RETRY_DELAYS="5s,1m")
    lines = kafka_acls_lines(required(s), "User:svc")
    assert lines[0] == (
        "--add --allow-principal User:svc --operation Read --operation Write --operation Create --operation "
        "DescribeConfigs --topic billing- --resource-pattern-type prefixed"
    )
    assert (
        "--add --allow-principal User:svc --operation Write --operation Create --operation DescribeConfigs --topic "
        "prod.results" in lines
    )  # never read
    assert "--add --allow-principal User:svc --operation Read --group billing" in lines
    assert lines[1] == (
        "--add --allow-principal User:svc --operation Delete --topic billing-reply- --resource-pattern-type prefixed"
    )  # a stopping worker deletes its reply topic
    topics = [line.split("--topic ")[1] for line in lines if "--topic " in line]
    assert topics == [
        "billing- --resource-pattern-type prefixed",
        "billing-reply- --resource-pattern-type prefixed",
        "prod.input",
        "prod.retry-5s",
        "prod.retry-1m",
        "prod.dlq",
        "prod.results",
        "prod.dlqapp-due",
        "prod.dlqapp-commands",
    ]
    assert not any("--cluster" in line or "All" in line for line in lines)
    default = [
        line.split("--topic ")[1] for line in kafka_acls_lines(required(settings()), "User:x") if "--topic " in line
    ]
    assert "dlqapp-due" not in default  # the default internal topics sit under the prefixed grant


def test_exactly_once_adds_write_and_describe_on_the_transactional_ids_and_nothing_else():
    at_least_once = kafka_acls_lines(
        required(settings(DLQ_APP_ID="billing", DLQ_PROCESSING_GUARANTEE="at_least_once")), "User:svc"
    )
    exactly_once = kafka_acls_lines(
        required(settings(DLQ_APP_ID="billing", DLQ_PROCESSING_GUARANTEE="exactly_once")), "User:svc"
    )
    assert not any("--transactional-id" in line for line in at_least_once)
    assert exactly_once[: len(at_least_once)] == at_least_once
    assert exactly_once[len(at_least_once) :] == [
        "--add --allow-principal User:svc --operation Write --operation Describe --transactional-id billing- "
        "--resource-pattern-type prefixed"
    ]


def test_missing_operations_follow_kafkas_implications():
    grants = required(settings())
    bits = lambda *ops: sum(1 << op.value for op in ops)  # noqa: E731
    assert (
        missing(
            grants,
            "topic",
            name="input",
            bits=bits(Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE_CONFIGS),
        )
        == []
    )
    assert missing(
        grants, "topic", name="input", bits=bits(Operation.READ, Operation.CREATE, Operation.ALTER_CONFIGS)
    ) == [Operation.WRITE]
    assert missing(grants, "topic", name="dlqapp-stats-changelog", bits=bits(Operation.WRITE)) == [
        Operation.READ,
        Operation.CREATE,
        Operation.DESCRIBE_CONFIGS,
    ]
    assert missing(grants, "group", name="dlqapp", bits=bits(Operation.DESCRIBE)) == [Operation.READ]
    # Delete on the reply topics is printed, not required: without it a stop leaves the topic
    reply = "dlqapp-reply-0b7f"
    assert missing(grants, "topic", name=reply, bits=bits(*TOPIC_OPS)) == []
    assert missing(grants, "topic", name=reply, bits=bits(Operation.READ)) == [
        Operation.WRITE,
        Operation.CREATE,
        Operation.DESCRIBE_CONFIGS,
    ]


def test_connection_failures_that_retrying_cannot_cure_are_explained():
    sasl = KafkaSecurity("SASL_SSL", "SCRAM-SHA-512", "dlqapp", Secret("x"))
    bad_login = [
        'Unable connect to "b:9093": [Error 58] SaslAuthenticationFailed: Authentication failed during '
        "authentication due to invalid credentials"
    ]
    assert "DLQ_KAFKA_SASL_USERNAME=dlqapp" in explain(
        bad_login, sasl, "b:9093"
    ) and "DLQ_KAFKA_SASL_PASSWORD" in explain(bad_login, sasl, "b:9093")
    untrusted = [
        'Unable connect to "b:9093": [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed '
        "certificate in certificate chain"
    ]
    assert "DLQ_KAFKA_SSL_CAFILE" in explain(untrusted, sasl, "b:9093")
    wrong_name = [
        "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: IP address mismatch, certificate is not valid "
        "for '10.0.0.1'"
    ]
    assert "DLQ_KAFKA_SSL_CHECK_HOSTNAME" in explain(wrong_name, sasl, "b:9093")
    closed = ['Unable connect to "b:9093": KafkaConnectionError: Connection at b:9093 closed']
    assert "DLQ_KAFKA_SECURITY_PROTOCOL=PLAINTEXT" in explain(closed, KafkaSecurity(), "b:9093")
    assert explain(["Connect call failed ('127.0.0.1', 9093)"], sasl, "b:9093") is None  # down: retried, not refused
