"""The topics of a worker's Faust app beyond dlqapp's own: those Faust declares, and all
that its producer writes to."""

from __future__ import annotations

from typing import Any

from mode.utils.times import want_seconds

from dlqapp.kafka.topic_checks import MAX_MESSAGE_BYTES, InternalTopic


def internal_topics(app: Any) -> dict[str, InternalTopic]:
    """The topics Faust declares itself, as Faust would declare them: the tables'
    changelogs (compacted), the leader topic and this worker's reply topic."""
    topics = {
        table.changelog_topic_name: InternalTopic(
            table.partitions or app.conf.topic_partitions,
            {"cleanup.policy": "compact", MAX_MESSAGE_BYTES: str(app.dlq_settings.table_record_bytes)},
        )
        for table in app.tables.values()
    }
    topics[f"{app.conf.id}-__assignor-__leader"] = InternalTopic(1, {})
    reply_ms = int(want_seconds(app.conf.reply_expires) * 1000)
    topics[app.conf.reply_to] = InternalTopic(
        1, {"cleanup.policy": "delete", "retention.ms": str(reply_ms)}, ephemeral=True
    )
    return topics


def written_topics(app: Any) -> list[str]:
    """Every topic the app's producer writes to, but other workers' reply topics."""
    return [
        *app.dlq_settings.all_topics(),
        *(table.changelog_topic_name for table in app.tables.values()),
        app.conf.reply_to,
    ]
