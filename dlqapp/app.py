"""The Faust app: built from settings, and little else.

Agents, tables, views and commands live in their own modules and register on `app`.
"""

from __future__ import annotations

import logging
import socket
import sys
from urllib.parse import urlsplit

import faust
from faust.transport.drivers.aiokafka import Producer as AIOKafkaProducer

from dlqapp.auth import AccessPolicy, guard_middleware, host_name
from dlqapp.durability import ConfirmedTable
from dlqapp.logs import apply_log_format, configure_logging
from dlqapp.settings import Settings, SettingsError
from dlqapp.topics import TopicMismatchError, ensure_topics

log = logging.getLogger(__name__)


def load_settings() -> Settings:
    """Settings from the environment; exit with a message naming the bad variable."""
    try:
        return Settings.from_env()
    except SettingsError as exc:
        print(f"dlqapp: invalid setting: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


class IdempotentProducer(AIOKafkaProducer):
    """Faust's producer with acks=all and idempotence, so retried sends never duplicate."""

    def _settings_extra(self) -> dict:
        return {**super()._settings_extra(), "acks": "all", "enable_idempotence": True}


class DlqApp(faust.App):
    """A Faust app that ensures its topics before consuming and produces idempotently."""

    dlq_settings: Settings

    async def on_first_start(self) -> None:
        await super().on_first_start()
        apply_log_format(self.dlq_settings)
        try:
            created = await ensure_topics(self.dlq_settings)
        except TopicMismatchError as exc:
            log.critical("refusing to start: %s", exc)
            print(f"dlqapp: refusing to start: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(3) from None
        if created:
            log.info("topics_created names=%s", ",".join(created))

    async def release_in_flight(self, reopen: bool) -> None:
        """Hand back unfinished events (set by dlqapp.agents); a no-op before wiring."""

    async def on_stop(self) -> None:
        # Before Faust's consumer waits for every event to be acked: events held by the
        # breaker never would be, so they are handed back unacked first (Ctrl-C, SIGTERM).
        await self.release_in_flight(reopen=False)
        await super().on_stop()

    async def _on_partitions_revoked(self, revoked: set) -> None:
        # Same for a rebalance (Faust's hook waits for acks, then commits): bounded by
        # DLQ_DRAIN_TIMEOUT, so held work never outlasts the rebalance timeout.
        if not self.should_stop:
            await self.release_in_flight(reopen=True)
        await super()._on_partitions_revoked(revoked)

    def _new_producer(self) -> IdempotentProducer:
        return IdempotentProducer(self.transport, loop=self.loop, beacon=self.beacon)


def access_policy(settings: Settings) -> AccessPolicy:
    """Who the HTTP server answers to: this machine's names, the advertised host, the extras."""
    hosts = {settings.web_host.lower(), socket.gethostname().lower(), socket.getfqdn().lower(), *settings.allowed_hosts}
    if settings.web_advertised_url:
        hosts.add(host_name(urlsplit(settings.web_advertised_url).netloc))
    return AccessPolicy(token=settings.admin_token, hosts=frozenset(hosts), origins=frozenset(settings.allowed_origins))


def create_app(settings: Settings) -> DlqApp:
    """A configured, not yet started, dlqapp Faust app."""
    configure_logging(settings)
    brokers = ";".join(settings.kafka_bootstrap.split(","))
    app = DlqApp(
        settings.app_id,
        broker=f"kafka://{brokers}",
        store="rocksdb://",
        datadir=settings.data_dir,
        autodiscover=False,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,
        broker_session_timeout=settings.session_timeout_ms / 1000,
        broker_heartbeat_interval=min(3.0, settings.session_timeout_ms / 3000),
        broker_max_poll_records=settings.max_poll_records,
        producer_acks=-1,
        producer_max_request_size=settings.max_message_bytes,
        web_bind=settings.web_host,
        web_host=settings.web_host,
        web_port=settings.web_port,
        web_tables_enabled=False,
        web_application_options={
            "client_max_size": settings.max_body_bytes,
            "middlewares": [guard_middleware(access_policy(settings))],
        },
        reply_create_topic=True,
        stream_wait_empty=True,
        table_standby_replicas=1,
        Table=ConfirmedTable,
    )
    if settings.web_advertised_url:
        app.conf.canonical_url = settings.web_advertised_url
    app.dlq_settings = settings
    return app


settings = load_settings()
app = create_app(settings)
