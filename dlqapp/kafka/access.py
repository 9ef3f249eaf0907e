"""At start: can this client reach Kafka, log in, and do what the deployment needs?

Misconfiguration must end the worker within seconds with an error naming what to fix,
never a hang or a crash loop. Two checks:

- `ConnectionCauses` hears why aiokafka could not connect (it logs the cause and raises a
  bare "Unable to bootstrap"), and `explain` turns a refused login, an untrusted
  certificate or a protocol mismatch into a message naming the DLQ_KAFKA_* setting. A
  broker that is down is not misconfiguration: the caller keeps retrying then.
- `check_access` asks the brokers what this principal may do (Metadata v8's
  `topic_authorized_operations`, DescribeGroups v3's `authorized_operations`) and compares
  it with dlqapp.kafka.acls.required: a missing ACL is named with its operation and
  resource, and points at `faust -A dlqapp acls`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from aiokafka.protocol.admin import DescribeGroupsResponse_v3
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Boolean, Int16, Int32, Schema, String

from dlqapp.kafka.acls import Grant, Operation, missing, required
from dlqapp.settings.kafka_security import KafkaSecurity

if TYPE_CHECKING:
    from aiokafka.admin import AIOKafkaAdminClient

    from dlqapp.settings import Settings

TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
OPERATIONS_UNKNOWN = -(2**31)
"""`authorized_operations` when the broker did not compute them."""


class KafkaAccessError(RuntimeError):
    """dlqapp cannot use Kafka as configured (login, TLS, ACLs); the message says what to fix."""


class MetadataResponse_v8(Response):
    API_KEY = 3
    API_VERSION = 8
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("brokers", Array(("node_id", Int32), ("host", String("utf-8")), ("port", Int32), ("rack", String("utf-8")))),
        ("cluster_id", String("utf-8")),
        ("controller_id", Int32),
        (
            "topics",
            Array(
                ("error_code", Int16),
                ("topic", String("utf-8")),
                ("is_internal", Boolean),
                (
                    "partitions",
                    Array(
                        ("error_code", Int16),
                        ("partition", Int32),
                        ("leader", Int32),
                        ("leader_epoch", Int32),
                        ("replicas", Array(Int32)),
                        ("isr", Array(Int32)),
                        ("offline_replicas", Array(Int32)),
                    ),
                ),
                ("topic_authorized_operations", Int32),
            ),
        ),
        ("cluster_authorized_operations", Int32),
    )


class MetadataRequest_v8(RequestStruct):
    API_KEY = 3
    API_VERSION = 8
    RESPONSE_TYPE = MetadataResponse_v8
    SCHEMA = Schema(
        ("topics", Array(String("utf-8"))),
        ("allow_auto_topic_creation", Boolean),
        ("include_cluster_authorized_operations", Boolean),
        ("include_topic_authorized_operations", Boolean),
    )


class AuthorizedOperationsRequest(Request[MetadataRequest_v8]):
    """Metadata of some topics with what the asking principal may do on each (Kafka 2.3+)."""

    API_KEY = 3

    def __init__(self, topics: list[str]) -> None:
        self._topics = topics

    def build(self, request_struct_class: type[MetadataRequest_v8]) -> MetadataRequest_v8:
        return request_struct_class(self._topics, False, False, True)


class DescribeGroupsRequest_v3(RequestStruct):
    """aiokafka's own v3 reads the answer as v2 and drops `authorized_operations`."""

    API_KEY = 15
    API_VERSION = 3
    RESPONSE_TYPE = DescribeGroupsResponse_v3
    SCHEMA = Schema(("groups", Array(String("utf-8"))), ("include_authorized_operations", Boolean))


class GroupOperationsRequest(Request[DescribeGroupsRequest_v3]):
    """A consumer group with what the asking principal may do on it."""

    API_KEY = 15

    def __init__(self, group: str) -> None:
        self._group = group

    def build(self, request_struct_class: type[DescribeGroupsRequest_v3]) -> DescribeGroupsRequest_v3:
        return request_struct_class([self._group], True)


class ConnectionCauses(logging.Handler):
    """Keeps the last reasons aiokafka logged for a failed connection.

    aiokafka says why a connection failed only in its ERROR lines, so while a connection is
    tried its logger lets them through even where logging was set to hide them."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []
        self._level = logging.NOTSET

    def emit(self, record: logging.LogRecord) -> None:
        self.messages = [*self.messages[-9:], record.getMessage()]

    def __enter__(self) -> ConnectionCauses:
        logger = logging.getLogger("aiokafka")
        self._level = logger.level
        if not logger.isEnabledFor(logging.ERROR):
            logger.setLevel(logging.ERROR)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger("aiokafka")
        logger.removeHandler(self)
        logger.setLevel(self._level)


def closed_at_once(causes: list[str]) -> bool:
    """The listener closed the connection before answering: another protocol than ours, or a
    proxy or load balancer in front of a broker that is down (for a while)."""
    text = " ".join(causes)
    return "closed" in text and ("Connection at" in text or "connection was closed" in text.lower())


def explain(causes: list[str], security: KafkaSecurity, bootstrap: str) -> str | None:
    """What to fix, when the connection failed for a reason that retrying will not cure."""
    text = " ".join(causes)
    if "SaslAuthenticationFailed" in text or "Authentication failed" in text:
        return (
            f"Kafka at {bootstrap} refused the login of DLQ_KAFKA_SASL_USERNAME={security.username} "
            f"with {security.mechanism}: "
            "check DLQ_KAFKA_SASL_PASSWORD (or the file DLQ_KAFKA_SASL_PASSWORD_FILE) and DLQ_KAFKA_SASL_MECHANISM"
        )
    if "UnsupportedSaslMechanism" in text or ("mechanism" in text.lower() and "not enabled" in text.lower()):
        return (
            f"Kafka at {bootstrap} does not offer DLQ_KAFKA_SASL_MECHANISM={security.mechanism}: "
            "use one its listener enables"
        )
    if "CERTIFICATE_VERIFY_FAILED" in text:
        if "hostname" in text.lower() or "IP address mismatch" in text:
            return (
                f"the certificate of Kafka at {bootstrap} does not name that host: "
                "connect by a name the certificate lists "
                "(DLQ_KAFKA_BOOTSTRAP), or, only by choice, DLQ_KAFKA_SSL_CHECK_HOSTNAME=false"
            )
        return (
            f"the certificate of Kafka at {bootstrap} is not trusted: set DLQ_KAFKA_SSL_CAFILE to the CA that signed it"
        )
    if "WRONG_VERSION_NUMBER" in text or "record layer failure" in text or "UNEXPECTED_EOF" in text:
        return (
            f"Kafka at {bootstrap} does not speak TLS on that port: check "
            f"DLQ_KAFKA_SECURITY_PROTOCOL={security.protocol} and the port"
        )
    if (
        "certificate required" in text.lower()
        or "TLSV13_ALERT_CERTIFICATE_REQUIRED" in text
        or "SSLV3_ALERT_BAD_CERTIFICATE" in text
    ):
        return f"Kafka at {bootstrap} wants a client certificate: set DLQ_KAFKA_SSL_CERTFILE and DLQ_KAFKA_SSL_KEYFILE"
    if closed_at_once(causes):
        return (
            f"Kafka at {bootstrap} closed the connection at once: it likely expects another protocol than "
            f"DLQ_KAFKA_SECURITY_PROTOCOL={security.protocol} (SSL, SASL_SSL, ...) or a client certificate "
            "(or a proxy in front of it has had no broker behind it for a while)"
        )
    return None


async def check_access(admin: AIOKafkaAdminClient, settings: Settings, topics: list[str]) -> None:
    """Raise KafkaAccessError naming every ACL the principal lacks on `topics` and the group."""
    grants = required(settings)
    lacking: dict[Grant, set[Operation]] = {}
    response = await admin._send_request(AuthorizedOperationsRequest(topics))
    for topic in response.to_object()["topics"]:
        if topic["error_code"] == TOPIC_AUTHORIZATION_FAILED:
            _note(lacking, grants, "topic", topic["topic"], None)
        elif topic["error_code"] == 0:
            _note(lacking, grants, "topic", topic["topic"], topic["topic_authorized_operations"])
    await _note_group(admin, settings, grants, lacking)
    if lacking:
        named = "; ".join(
            f"{', '.join(op.name for op in sorted(ops))} on {_pattern(grant)}" for grant, ops in lacking.items()
        )
        raise KafkaAccessError(
            f"{principal_of(settings)} lacks ACLs on Kafka at {settings.kafka_bootstrap}: {named}. "
            f"`faust -A dlqapp acls --principal {principal_of(settings)}` "
            "prints every ACL this deployment needs, as kafka-acls arguments"
        )


async def _note_group(
    admin: AIOKafkaAdminClient, settings: Settings, grants: list[Grant], lacking: dict[Grant, set[Operation]]
) -> None:
    group = settings.app_id
    try:
        node = await admin.find_coordinator(group)
    except Exception as exc:  # GroupAuthorizationFailed: not even DESCRIBE
        if getattr(exc, "errno", None) != GROUP_AUTHORIZATION_FAILED:
            raise
        _note(lacking, grants, "group", group, None)
        return
    response = await admin._send_request(GroupOperationsRequest(group), node)
    (described,) = response.to_object()["groups"]
    bits = None if described["error_code"] == GROUP_AUTHORIZATION_FAILED else described["authorized_operations"]
    _note(lacking, grants, "group", group, bits)


def _note(
    lacking: dict[Grant, set[Operation]], grants: list[Grant], resource: str, name: str, bits: int | None
) -> None:
    """Add what `name` lacks to the grant that covers it (everything it needs when `bits` is None: not even visible)."""
    if bits == OPERATIONS_UNKNOWN:
        return  # the broker did not say (no authorizer answers so): nothing to judge
    for grant in grants:
        if grant.covers(resource, name) and not grant.optional:
            absent = grant.operations if bits is None else missing([grant], resource, name=name, bits=bits)
            if absent:
                lacking.setdefault(grant, set()).update(absent)
            return


def _pattern(grant: Grant) -> str:
    return f"{grant.resource}s prefixed {grant.name}" if grant.prefixed else f"{grant.resource} {grant.name}"


def principal_of(settings: Settings) -> str:
    """The principal as the ACLs name it, when the settings say (SASL); else a placeholder."""
    security = settings.kafka_security
    return f"User:{security.username}" if security.uses_sasl else "User:<this client's principal>"
