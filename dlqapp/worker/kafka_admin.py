"""dlqapp's topics: create the missing ones, refuse to run on mismatched ones.

Faust creates only its own internal topics. Every dlqapp topic must have the same
partition count, because tables are co-partitioned with them: partition p of `input`,
of each tier, of `dlq` and of the tables all belong to the same worker.
"""

from __future__ import annotations

import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import TopicAlreadyExistsError, for_code

from dlqapp.settings import Settings

log = logging.getLogger(__name__)

COMPACTED = {"cleanup.policy": "compact"}


class TopicMismatchError(RuntimeError):
    """An existing topic does not have the shape dlqapp needs."""


def topic_configs(settings: Settings) -> dict[str, dict[str, str]]:
    """Topic name → configs dlqapp creates it with."""
    size = {"max.message.bytes": str(settings.max_message_bytes)}
    return {name: ({**COMPACTED, **size} if name == settings.dlq else size) for name in settings.all_topics()}


async def ensure_topics(settings: Settings) -> list[str]:
    """Create missing topics; raise `TopicMismatchError` if an existing one differs.

    Returns the names of the topics that were created.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, client_id=f"{settings.app_id}-admin")
    await admin.start()
    try:
        wanted = topic_configs(settings)
        existing = await _partition_counts(admin, list(wanted))
        _check_partitions(settings, existing)
        await _check_dlq_compacted(admin, settings, existing)
        missing = [name for name in wanted if name not in existing]
        if missing:
            await _create(admin, settings, {name: wanted[name] for name in missing})
        return missing
    finally:
        await admin.close()


async def _partition_counts(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    listed = set(await admin.list_topics())
    present = [n for n in names if n in listed]
    if not present:
        return {}
    described = await admin.describe_topics(present)
    return {d["topic"]: len(d["partitions"]) for d in described if d["error_code"] == 0}


def _check_partitions(settings: Settings, existing: dict[str, int]) -> None:
    wrong = {name: count for name, count in existing.items() if count != settings.partitions}
    if wrong:
        found = ", ".join(f"{n} has {c}" for n, c in sorted(wrong.items()))
        raise TopicMismatchError(
            f"topic partition counts differ from DLQ_PARTITIONS={settings.partitions}: {found}. "
            "All dlqapp topics must have the same partition count: set DLQ_PARTITIONS to match, "
            "or use other topics (DLQ_TOPIC_PREFIX)."
        )


async def _check_dlq_compacted(admin: AIOKafkaAdminClient, settings: Settings, existing: dict[str, int]) -> None:
    if settings.dlq not in existing:
        return
    resource = ConfigResource(ConfigResourceType.TOPIC, settings.dlq)
    (response,) = await admin.describe_configs([resource])
    for _, _, _, _, entries in response.resources:
        policy = next((e[1] for e in entries if e[0] == "cleanup.policy"), "")
        if "compact" not in (policy or ""):
            raise TopicMismatchError(
                f"topic {settings.dlq} has cleanup.policy={policy}, but the DLQ topic must be "
                f"compacted: run `kafka-configs --alter --entity-type topics --entity-name {settings.dlq} "
                "--add-config cleanup.policy=compact`, or set DLQ_DLQ_TOPIC to another topic."
            )


async def _create(admin: AIOKafkaAdminClient, settings: Settings, configs: dict[str, dict[str, str]]) -> None:
    new = [
        NewTopic(name, settings.partitions, settings.replication_factor, topic_configs=config)
        for name, config in configs.items()
    ]
    response = await admin.create_topics(new)
    for topic_errors in getattr(response, "topic_errors", []):
        name, code = topic_errors[0], topic_errors[1]
        if code and for_code(code) is not TopicAlreadyExistsError:
            raise TopicMismatchError(f"could not create topic {name}: {for_code(code).__name__}")
