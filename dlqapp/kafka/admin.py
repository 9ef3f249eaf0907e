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
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
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
from dlqapp.settings import Settings
from dlqapp.settings.model import record_bytes, table_bytes

log = logging.getLogger(__name__)
T = TypeVar("T")

COMPACTED = {"cleanup.policy": "compact"}
MIN_ISR = "min.insync.replicas"
MAX_MESSAGE_BYTES = "max.message.bytes"
CHANGELOG_SUFFIX = "-changelog"
DYNAMIC_TOPIC_CONFIG = 1
"""`config_source` of a setting made on the topic itself (DescribeConfigs v1+)."""
KNOWN_WITHIN_S = 30.0
"""How long a created topic may take to reach every broker's metadata."""
RETRY_FOR_S = 90.0
"""How long the checks are retried while a broker is down or a leadership moves (the
controller fences a dead broker after its session timeout, 9 s by default)."""


class TopicMismatchError(RuntimeError):
    """An existing topic does not have the shape dlqapp needs, or the cluster cannot hold it."""


@dataclass(frozen=True)
class InternalTopic:
    """A topic Faust would declare on its own (a changelog, the leader or reply topic)."""

    partitions: int
    configs: dict[str, str]
    ephemeral: bool = False
    """Made anew at each start (a worker's reply topic): created with the replicas the live
    brokers allow, so a broker down never stops a worker from starting."""


@dataclass(frozen=True)
class TopicShape:
    """What the cluster says about one existing topic."""

    partitions: int
    replicas: int


def topic_configs(settings: Settings) -> dict[str, dict[str, str]]:
    """Topic name → configs dlqapp creates it with: `input` takes records of up to
    DLQ_MAX_MESSAGE_BYTES, every other topic those and dlqapp's headers."""
    configs = {}
    for name in settings.all_topics():
        size = settings.max_message_bytes if name == settings.input else settings.written_record_bytes
        base = {MAX_MESSAGE_BYTES: str(size), MIN_ISR: str(settings.min_insync_replicas)}
        configs[name] = {**COMPACTED, **base} if name == settings.dlq else base
    return configs


async def ensure_topics(settings: Settings, internal: Mapping[str, InternalTopic] | None = None) -> list[str]:
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
    closed_since: list[float] = []
    return await retry_while_transient(
        lambda: _ensure_once(settings, internal, closed_since),
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


async def _ensure_once(settings: Settings, internal: dict[str, InternalTopic], closed_since: list[float]) -> list[str]:
    admin = await connect_admin(settings, closed_since)
    try:
        wanted = topic_configs(settings)
        changelogs = list(internal)
        await _wait_for_coordinator(admin, settings)
        await check_access(admin, settings, [*wanted, *changelogs])
        existing = await _shapes(admin, [*wanted, *changelogs])
        _check_partitions(settings, {n: s for n, s in existing.items() if n in wanted})
        _check_replicas(settings, existing)
        await _check_dlq_compacted(admin, settings, existing)
        await _check_record_sizes(
            admin, settings, [n for n in existing if n in wanted or n.endswith(CHANGELOG_SUFFIX)], internal
        )
        brokers = await _live_brokers(admin)
        missing = [
            name
            for name in [*wanted, *changelogs]
            if name not in existing and not (name in internal and internal[name].ephemeral)
        ]
        if missing:
            _check_brokers(settings, brokers, missing)
        elif len(brokers) < settings.replication_factor:
            log.warning(
                "brokers_below_replication live=%d DLQ_REPLICATION_FACTOR=%d: "
                "writes need DLQ_MIN_INSYNC_REPLICAS=%d in-sync replicas",
                len(brokers),
                settings.replication_factor,
                settings.min_insync_replicas,
            )
        await _align_min_insync(admin, settings, [n for n in existing if n in wanted or n in changelogs])
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


async def connect_admin(settings: Settings, closed_since: list[float] | None = None) -> AIOKafkaAdminClient:
    """A started admin client; KafkaAccessError when the settings cannot work (a refused
    login, an untrusted certificate, another protocol), KafkaConnectionError when Kafka is
    not reachable (retried by the caller).

    A connection the listener closes at once is ambiguous: another protocol, or a broker
    down behind a proxy or load balancer. It is retried (KafkaConnectionError) until
    `CLOSED_AT_ONCE_FOR_S` after the first such close (`closed_since` keeps when that was)."""
    admin = AIOKafkaAdminClient(**settings.kafka_client(client_id=f"{settings.app_id}-admin"))
    with ConnectionCauses() as causes:
        try:
            await admin.start()
        except KafkaConnectionError:
            await admin.close()
            reason = explain(causes.messages, settings.kafka_security, settings.kafka_bootstrap)
            if reason is not None and closed_at_once(causes.messages) and closed_since is not None:
                if not closed_since:
                    closed_since.append(time.monotonic())
                if time.monotonic() - closed_since[0] < CLOSED_AT_ONCE_FOR_S:
                    raise
            if reason is not None:
                raise KafkaAccessError(reason) from None
            raise
    return admin


async def _shapes(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, TopicShape]:
    listed = set(await admin.list_topics())
    present = [n for n in names if n in listed]
    if not present:
        return {}
    described = await admin.describe_topics(present)
    return {
        d["topic"]: TopicShape(len(d["partitions"]), min((len(p["replicas"]) for p in d["partitions"]), default=0))
        for d in described
        if d["error_code"] == 0
    }


async def _live_brokers(admin: AIOKafkaAdminClient) -> list[int]:
    cluster = await admin.describe_cluster()
    return sorted(b["node_id"] for b in cluster["brokers"])


def _check_partitions(settings: Settings, existing: dict[str, TopicShape]) -> None:
    wrong = {name: shape.partitions for name, shape in existing.items() if shape.partitions != settings.partitions}
    if wrong:
        found = ", ".join(f"{n} has {c}" for n, c in sorted(wrong.items()))
        raise TopicMismatchError(
            f"topic partition counts differ from DLQ_PARTITIONS={settings.partitions}: {found}. "
            "All dlqapp topics must have the same partition count: set DLQ_PARTITIONS to match, "
            "or use other topics (DLQ_TOPIC_PREFIX)."
        )


def _check_replicas(settings: Settings, existing: dict[str, TopicShape]) -> None:
    """Too few replicas for DLQ_MIN_INSYNC_REPLICAS refuses every write: refuse to start.
    Fewer than DLQ_REPLICATION_FACTOR is only reported (dlqapp never reassigns replicas)."""
    need = settings.min_insync_replicas
    short = {n: s.replicas for n, s in existing.items() if s.replicas < need}
    if short:
        found = ", ".join(f"{n} has {c}" for n, c in sorted(short.items()))
        raise TopicMismatchError(
            f"topics have fewer replicas than DLQ_MIN_INSYNC_REPLICAS={need}, "
            f"so no write to them could succeed: {found}. "
            "Lower DLQ_MIN_INSYNC_REPLICAS, or add replicas to these topics (kafka-reassign-partitions)."
        )
    fewer = sorted(n for n, s in existing.items() if s.replicas < settings.replication_factor)
    if fewer:
        log.warning(
            "topics_under_replicated DLQ_REPLICATION_FACTOR=%d topics=%s: existing topics keep their replicas; "
            "add replicas with kafka-reassign-partitions",
            settings.replication_factor,
            ",".join(fewer),
        )


def _check_brokers(settings: Settings, brokers: list[int], missing: list[str]) -> None:
    if len(brokers) >= settings.replication_factor:
        return
    raise TopicMismatchError(
        f"DLQ_REPLICATION_FACTOR={settings.replication_factor} needs at least {settings.replication_factor} brokers, "
        f"but the cluster at {settings.kafka_bootstrap} has {len(brokers)} "
        f"(ids {','.join(map(str, brokers)) or 'none'}), "
        f"and {len(missing)} topics are still to be created "
        f"({', '.join(sorted(missing)[:3])}{', ...' if len(missing) > 3 else ''}). "
        "Start more brokers, or lower DLQ_REPLICATION_FACTOR."
    )


async def _topic_configs(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, list[tuple[Any, ...]]]:
    """Topic → its config entries (name, value, read_only, source, …) as the broker gives them."""
    if not names:
        return {}
    responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names])
    return {resource[3]: list(resource[4]) for response in responses for resource in response.resources}


async def _check_dlq_compacted(admin: AIOKafkaAdminClient, settings: Settings, existing: dict[str, TopicShape]) -> None:
    if settings.dlq not in existing:
        return
    entries = (await _topic_configs(admin, [settings.dlq])).get(settings.dlq, [])
    policy = next((e[1] for e in entries if e[0] == "cleanup.policy"), "")
    if "compact" not in (policy or ""):
        raise TopicMismatchError(
            f"topic {settings.dlq} has cleanup.policy={policy}, but the DLQ topic must be "
            f"compacted: run `kafka-configs --alter --entity-type topics --entity-name {settings.dlq} "
            "--add-config cleanup.policy=compact`, or set DLQ_DLQ_TOPIC to another topic."
        )


async def _check_record_sizes(
    admin: AIOKafkaAdminClient, settings: Settings, existing: list[str], internal: Mapping[str, InternalTopic]
) -> None:
    """Refuse to start when an existing topic could not hold what dlqapp writes for the largest
    record `input` accepts (its max.message.bytes): a dead letter or retry of it (its bytes
    and dlqapp's headers) on the other topics, a DLQ entry of it in the table changelogs.
    A record that does not fit fails its transaction, and the worker would restart on it
    forever."""
    limits = {
        name: int(value)
        for name, entries in (await _topic_configs(admin, existing)).items()
        for entry in entries
        if entry[0] == MAX_MESSAGE_BYTES and (value := entry[1]) is not None and str(value).isdigit()
    }
    largest = limits.get(settings.input, settings.max_message_bytes)
    if largest > settings.max_message_bytes:
        raise TopicMismatchError(
            f"topic {settings.input} accepts records of up to {largest} bytes (its {MAX_MESSAGE_BYTES}), more than "
            f"DLQ_MAX_MESSAGE_BYTES={settings.max_message_bytes}: set DLQ_MAX_MESSAGE_BYTES={largest} (or more), "
            f"or lower the topic's {MAX_MESSAGE_BYTES}"
        )
    short = []
    for name, limit in sorted(limits.items()):
        if name == settings.input:
            continue
        need = table_bytes(largest, settings.max_payload_bytes) if name in internal else record_bytes(largest)
        if limit < need:
            short.append(f"{name} ({limit} < {need})")
    if short:
        raise TopicMismatchError(
            f"topics too small for the largest record {settings.input} accepts ({largest} bytes) with dlqapp's "
            f"headers: {', '.join(short)}. Raise each one's {MAX_MESSAGE_BYTES} (kafka-configs --alter "
            f"--entity-type topics --entity-name NAME --add-config {MAX_MESSAGE_BYTES}=N), or lower "
            f"DLQ_MAX_MESSAGE_BYTES and {settings.input}'s {MAX_MESSAGE_BYTES}."
        )


async def _align_min_insync(admin: AIOKafkaAdminClient, settings: Settings, names: list[str]) -> None:
    """Set min.insync.replicas on existing topics where it differs, keeping every other
    setting made on the topic (AlterConfigs replaces a topic's whole set)."""
    wanted = str(settings.min_insync_replicas)
    for name, entries in (await _topic_configs(admin, names)).items():
        current = next((e[1] for e in entries if e[0] == MIN_ISR), None)
        if current == wanted:
            continue
        if any(len(e) < 6 for e in entries):  # DescribeConfigs v0 has no config_source
            log.warning(
                "min_insync_unchanged topic=%s: the broker does not say which settings are the topic's own", name
            )
            continue
        own = {e[0]: e[1] for e in entries if e[3] == DYNAMIC_TOPIC_CONFIG and not e[4]}
        (response,) = [
            r
            for r in await admin.alter_configs(
                [ConfigResource(ConfigResourceType.TOPIC, name, {**own, MIN_ISR: wanted})]
            )
            if r.resources
        ]
        for error_code, error_message, *_ in response.resources:
            if error_code:
                raise TopicMismatchError(
                    (
                        f"could not set {MIN_ISR}={wanted} on topic {name}: "
                        f"{for_code(error_code).__name__} {error_message or ''}"
                    ).strip()
                )
        log.info("min_insync_set topic=%s from=%s to=%s", name, current, wanted)


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
