"""dlqapp's topics: create the missing ones, refuse to run on mismatched ones.

Faust creates only its own internal topics. Every dlqapp topic must have the same
partition count, because tables are co-partitioned with them: partition p of `input`,
of each tier, of `dlq` and of the tables all belong to the same worker.

Durability rests on acks=all writes and `min.insync.replicas`: dlqapp creates its topics
with `DLQ_REPLICATION_FACTOR` replicas and sets `min.insync.replicas` on them and on
Faust's changelog topics, existing ones included.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    NodeNotReadyError,
    NotCoordinatorError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    for_code,
)
from aiokafka.protocol.metadata import MetadataRequest

from dlqapp.kafka.access import (
    ConnectionCauses,
    KafkaAccessError,
    check_access,
    closed_at_once,
    explain,
    principal_of,
)
from dlqapp.kafka.topic_checks import (
    MAX_MESSAGE_BYTES,
    MIN_ISR,
    InternalTopic,
    TopicMismatchError,
    align_min_insync,
    check_brokers,
    check_dlq_compacted,
    check_partitions,
    check_record_sizes,
    check_replicas,
    shapes,
)
from dlqapp.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

COMPACTED = {"cleanup.policy": "compact"}
CHANGELOG_SUFFIX = "-changelog"
KNOWN_WITHIN_S = 30.0
"""How long a created topic may take to reach every broker's metadata."""
RETRY_FOR_S = 90.0
"""How long the checks are retried while a broker is down or a leadership moves (the
controller fences a dead broker after its session timeout, 9 s by default)."""


def topic_configs(settings: Settings) -> dict[str, dict[str, str]]:
    """Topic name → configs dlqapp creates it with: `input` takes records of up to
    DLQ_MAX_MESSAGE_BYTES, every other topic those and dlqapp's headers."""
    configs = {}
    for name in settings.all_topics():
        size = settings.max_message_bytes if name == settings.input else settings.written_record_bytes
        base = {MAX_MESSAGE_BYTES: str(size), MIN_ISR: str(settings.min_insync_replicas)}
        configs[name] = {**COMPACTED, **base} if name == settings.dlq else base
    return configs


async def ensure_topics(
    settings: Settings, internal: Mapping[str, InternalTopic] | None = None, *, worked_before: bool = False
) -> list[str]:
    """Create missing topics and wait until every broker knows them all; raise
    `TopicMismatchError` if an existing one differs, or if topics are missing and the
    cluster has fewer brokers than DLQ_REPLICATION_FACTOR.

    `internal` are the topics Faust would declare itself (changelogs, the leader topic,
    the reply topic): dlqapp creates them first, so that on a brand-new cluster the
    group's first assignment already holds them (Faust's own declaration races the
    consumer's first join, and a changelog missing then stays unassigned). Their
    `min.insync.replicas` is kept in line too. Returns the created names.
    """
    internal = dict(internal or {})
    # a worker restarted in place connected with these settings before: a listener closing
    # its connections is a broker away, not another protocol, for as long as checks retry
    closed = ClosedAtOnce(RETRY_FOR_S if worked_before else CLOSED_AT_ONCE_FOR_S)
    return await retry_while_transient(
        lambda: _ensure_once(settings, internal, closed),
        lambda exc: log.warning("topics_check_retry error=%r", exc),
    )


async def retry_while_transient(attempt: Callable[[], Awaitable[T]], on_retry: Callable[[Exception], object]) -> T:
    """`attempt()` again every second while it fails with a transient Kafka error, for up
    to RETRY_FOR_S; `on_retry` hears of each failure that is retried."""
    deadline = time.monotonic() + RETRY_FOR_S
    while True:
        try:
            return await attempt()
        except (KafkaError, TimeoutError) as exc:
            if not transient(exc) or time.monotonic() > deadline:
                raise
            on_retry(exc)
            await asyncio.sleep(1.0)


def transient(exc: BaseException) -> bool:
    """A broker that is down or not yet fenced, a request that timed out (a `create_topics`
    whose answer a broker down never sends included): ask again."""
    return isinstance(exc, (KafkaConnectionError, KafkaTimeoutError, TimeoutError)) or bool(
        getattr(exc, "retriable", False)
    )


async def _ensure_once(settings: Settings, internal: dict[str, InternalTopic], closed: ClosedAtOnce) -> list[str]:
    admin = await connect_admin(settings, closed)
    try:
        wanted = topic_configs(settings)
        changelogs = list(internal)
        await _wait_for_coordinator(admin, settings)
        await check_access(admin, settings, [*wanted, *changelogs])
        existing = await shapes(admin, [*wanted, *changelogs])
        check_partitions(settings, {n: s for n, s in existing.items() if n in wanted})
        check_replicas(settings, existing)
        await check_dlq_compacted(admin, settings, existing)
        await check_record_sizes(
            admin, settings, [n for n in existing if n in wanted or n.endswith(CHANGELOG_SUFFIX)], internal
        )
        brokers = await _live_brokers(admin)
        missing = [
            name
            for name in [*wanted, *changelogs]
            if name not in existing and not (name in internal and internal[name].ephemeral)
        ]
        if missing:
            check_brokers(settings, brokers, missing)
        elif len(brokers) < settings.replication_factor:
            log.warning(
                "brokers_below_replication live=%d DLQ_REPLICATION_FACTOR=%d: "
                "writes need DLQ_MIN_INSYNC_REPLICAS=%d in-sync replicas",
                len(brokers),
                settings.replication_factor,
                settings.min_insync_replicas,
            )
        await align_min_insync(admin, settings, [n for n in existing if n in wanted or n in changelogs])
        created = [name for name in wanted if name not in existing]
        if created:
            await _create(admin, settings, {name: wanted[name] for name in created})
        created_internal = [name for name in internal if name not in existing]
        for name in created_internal:
            topic = internal[name]
            replicas = (
                max(1, min(settings.replication_factor, len(brokers)))
                if topic.ephemeral
                else settings.replication_factor
            )
            min_isr = min(settings.min_insync_replicas, replicas)
            await _create(admin, settings, {name: {**topic.configs, MIN_ISR: str(min_isr)}}, topic.partitions, replicas)
        await _wait_until_known(
            admin, {**{n: settings.partitions for n in wanted}, **{n: t.partitions for n, t in internal.items()}}
        )
        if created or created_internal:
            await check_access(admin, settings, [*created, *created_internal])
        return [*created, *created_internal]
    finally:
        await admin.close()


CLOSED_AT_ONCE_FOR_S = 15.0
"""How long connections closed at once are taken for a broker down behind a proxy (retried)
before they are taken for another protocol than DLQ_KAFKA_SECURITY_PROTOCOL."""


class ClosedAtOnce:
    """Since when a listener closes connections at once, and how long that is borne."""

    def __init__(self, patience_s: float) -> None:
        self.patience_s = patience_s
        self.since: float | None = None

    def bear(self) -> bool:
        """One more connection closed at once: True while it may still be a broker away."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
        return now - self.since < self.patience_s


async def connect_admin(settings: Settings, closed: ClosedAtOnce | None = None) -> AIOKafkaAdminClient:
    """A started admin client; KafkaAccessError when the settings cannot work (a refused
    login, an untrusted certificate, another protocol), KafkaConnectionError when Kafka is
    not reachable (retried by the caller).

    A connection the listener closes at once is ambiguous: another protocol, or a broker
    down behind a proxy or load balancer. It is retried (KafkaConnectionError) until
    `closed`'s patience after the first such close (`CLOSED_AT_ONCE_FOR_S` by default)."""
    admin = AIOKafkaAdminClient(**settings.kafka_client(client_id=f"{settings.app_id}-admin"))
    with ConnectionCauses() as causes:
        try:
            await admin.start()
        except KafkaConnectionError:
            await admin.close()
            reason = explain(causes.messages, settings.kafka_security, settings.kafka_bootstrap)
            if reason is not None and closed_at_once(causes.messages) and closed is not None and closed.bear():
                raise
            if reason is not None:
                raise KafkaAccessError(reason) from None
            raise
    return admin


async def _live_brokers(admin: AIOKafkaAdminClient) -> list[int]:
    cluster = await admin.describe_cluster()
    return sorted(b["node_id"] for b in cluster["brokers"])


async def _wait_until_known(admin: AIOKafkaAdminClient, partitions: dict[str, int]) -> None:
    """Wait until every live broker's metadata has each topic with all its partitions led:
    a topic just created reaches the brokers a moment after CreateTopics returns, and a
    consumer group joined before that would leave it unassigned."""
    deadline = time.monotonic() + KNOWN_WITHIN_S
    for node in await _live_brokers(admin):
        while True:
            try:
                response = await admin._send_request_to_node(node, MetadataRequest(list(partitions)))
            except (TimeoutError, KafkaConnectionError, NodeNotReadyError) as exc:
                # a broker killed a moment ago is listed until the controller fences it
                log.debug("broker %s did not answer the topics check (%r); the others must know them", node, exc)
                break
            missing = _not_known(response.to_object()["topics"], partitions)
            if not missing:
                break
            if time.monotonic() > deadline:
                raise TopicMismatchError(
                    f"broker {node} still does not know topics {', '.join(sorted(missing)[:3])} "
                    f"{KNOWN_WITHIN_S:.0f} s after they were created; "
                    "check the brokers' health (kafka-topics --describe)"
                )
            await asyncio.sleep(0.1)


async def _wait_for_coordinator(admin: AIOKafkaAdminClient, settings: Settings) -> None:
    """Wait until the group has a coordinator: on a brand-new cluster the offsets topic is
    created on the first request for one, and a consumer asking meanwhile logs errors."""
    deadline = time.monotonic() + KNOWN_WITHIN_S
    while True:
        try:
            await admin.find_coordinator(settings.app_id)
            return
        except (CoordinatorNotAvailableError, NotCoordinatorError, CoordinatorLoadInProgressError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
        except GroupAuthorizationFailedError:
            return  # check_access names it, with every other missing ACL


def _not_known(described: list[dict[str, Any]], partitions: dict[str, int]) -> set[str]:
    """The topics a metadata answer lacks, or has with fewer partitions or a partition without leader."""
    known = {
        d["topic"]
        for d in described
        if d["error_code"] == 0
        and len(d["partitions"]) >= partitions.get(d["topic"], 0)
        and all(p["leader"] >= 0 for p in d["partitions"])
    }
    return set(partitions) - known


async def _create(
    admin: AIOKafkaAdminClient,
    settings: Settings,
    configs: dict[str, dict[str, str]],
    partitions: int | None = None,
    replicas: int | None = None,
) -> None:
    new = [
        NewTopic(name, partitions or settings.partitions, replicas or settings.replication_factor, topic_configs=config)
        for name, config in configs.items()
    ]
    response = await admin.create_topics(new)
    for topic_errors in getattr(response, "topic_errors", []):
        name, code = topic_errors[0], topic_errors[1]
        if code and for_code(code) is TopicAuthorizationFailedError:
            raise KafkaAccessError(
                f"{principal_of(settings)} may not create topic {name} on Kafka at {settings.kafka_bootstrap}: "
                "grant CREATE on it, "
                f"or create it yourself with {settings.partitions} partitions. "
                f"`faust -A dlqapp acls --principal {principal_of(settings)}` "
                "prints every ACL this deployment needs"
            )
        if code and for_code(code) is not TopicAlreadyExistsError:
            raise TopicMismatchError(f"could not create topic {name}: {for_code(code).__name__}")
