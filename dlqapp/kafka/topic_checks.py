"""The shape of dlqapp's topics and the checks of existing ones: partitions, replicas,
compaction, record sizes, and `min.insync.replicas` aligned where it differs. Each check
that fails raises `TopicMismatchError` naming the topic and the setting to change."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import for_code

from dlqapp.settings import Settings
from dlqapp.settings.model import record_bytes, table_bytes

log = logging.getLogger(__name__)

MIN_ISR = "min.insync.replicas"
MAX_MESSAGE_BYTES = "max.message.bytes"
DYNAMIC_TOPIC_CONFIG = 1
"""`config_source` of a setting made on the topic itself (DescribeConfigs v1+)."""


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


async def shapes(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, TopicShape]:
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


def check_partitions(settings: Settings, existing: dict[str, TopicShape]) -> None:
    wrong = {name: shape.partitions for name, shape in existing.items() if shape.partitions != settings.partitions}
    if wrong:
        found = ", ".join(f"{n} has {c}" for n, c in sorted(wrong.items()))
        raise TopicMismatchError(
            f"topic partition counts differ from DLQ_PARTITIONS={settings.partitions}: {found}. "
            "All dlqapp topics must have the same partition count: set DLQ_PARTITIONS to match, "
            "or use other topics (DLQ_TOPIC_PREFIX)."
        )


def check_replicas(settings: Settings, existing: dict[str, TopicShape]) -> None:
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


def check_brokers(settings: Settings, brokers: list[int], missing: list[str]) -> None:
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


async def topic_configs_of(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, list[tuple[Any, ...]]]:
    """Topic → its config entries (name, value, read_only, source, …) as the broker gives them."""
    if not names:
        return {}
    responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names])
    return {resource[3]: list(resource[4]) for response in responses for resource in response.resources}


async def check_dlq_compacted(admin: AIOKafkaAdminClient, settings: Settings, existing: dict[str, TopicShape]) -> None:
    if settings.dlq not in existing:
        return
    entries = (await topic_configs_of(admin, [settings.dlq])).get(settings.dlq, [])
    policy = next((e[1] for e in entries if e[0] == "cleanup.policy"), "")
    if "compact" not in (policy or ""):
        raise TopicMismatchError(
            f"topic {settings.dlq} has cleanup.policy={policy}, but the DLQ topic must be "
            f"compacted: run `kafka-configs --alter --entity-type topics --entity-name {settings.dlq} "
            "--add-config cleanup.policy=compact`, or set DLQ_DLQ_TOPIC to another topic."
        )


async def check_record_sizes(
    admin: AIOKafkaAdminClient, settings: Settings, existing: list[str], internal: Mapping[str, InternalTopic]
) -> None:
    """Refuse to start when an existing topic could not hold what dlqapp writes for the largest
    record `input` accepts (its max.message.bytes): a dead letter or retry of it (its bytes
    and dlqapp's headers) on the other topics, a DLQ entry of it in the table changelogs.
    A record that does not fit fails its transaction, and the worker would restart on it
    forever."""
    limits = {
        name: int(value)
        for name, entries in (await topic_configs_of(admin, existing)).items()
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


async def align_min_insync(admin: AIOKafkaAdminClient, settings: Settings, names: list[str]) -> None:
    """Set min.insync.replicas on existing topics where it differs, keeping every other
    setting made on the topic (AlterConfigs replaces a topic's whole set)."""
    wanted = str(settings.min_insync_replicas)
    for name, entries in (await topic_configs_of(admin, names)).items():
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
