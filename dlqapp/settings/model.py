"""Every dlqapp setting: its environment variable, type, default and meaning.

The fields are defined by concern in `kafka_fields`, `work_fields`, `backend_fields` and
`operations_fields`; this module gathers them into `Settings`. `Settings.from_env()` reads them,
validates each one, and raises `SettingsError` naming the variable to fix. The settings
table of docs/settings.md is generated from it (`scripts/readme-settings`) and checked by a test.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

from dlqapp.core.breaker import BreakerConfig
from dlqapp.core.errors import DEFAULT_RETRYABLE, ErrorClass
from dlqapp.core.tiers import Tier, build_tiers
from dlqapp.settings.backend_fields import BackendFields
from dlqapp.settings.kafka_fields import KafkaFields
from dlqapp.settings.kafka_security import KafkaSecurity, SecurityError
from dlqapp.settings.operations_fields import OperationsFields
from dlqapp.settings.parsing import format_duration
from dlqapp.settings.tracing import DEFAULT_PROTOCOL, exporter_entry_points
from dlqapp.settings.work_fields import WorkFields

RECORD_HEADROOM_BYTES = 1024 * 1024
"""Room for dlqapp's own headers beside a record's bytes (attempt history, errors, the original
headers of an invalid record: each bounded well below it)."""


def record_bytes(input_bytes: int) -> int:
    """The largest record dlqapp writes to a topic for an input record of `input_bytes`."""
    return input_bytes + RECORD_HEADROOM_BYTES


def table_bytes(input_bytes: int, max_payload_bytes: int) -> int:
    """The largest table record for an input record of `input_bytes` (see Settings.table_record_bytes)."""
    return input_bytes + min(input_bytes, max_payload_bytes) // 2 + 2 * RECORD_HEADROOM_BYTES


class SettingsError(ValueError):
    """A setting has an invalid value; the message names its environment variable."""


@dataclass(frozen=True)
class Settings(OperationsFields, BackendFields, WorkFields, KafkaFields):
    """Validated settings. Build with `Settings.from_env()`; the fields, each documenting
    itself, are defined by concern in the `*_fields` modules (in this order: Kafka, work,
    backend, operations)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read and validate every setting; raise `SettingsError` naming a bad variable."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            env, parse = f.metadata["env"], f.metadata["parse"]
            raw = environ.get(env, f.metadata["default"])
            try:
                values[f.name] = parse(raw)
            except (TypeError, ValueError) as exc:
                raise SettingsError(f"{env}={raw!r} is invalid: {exc}") from None
        values["data_dir"] = values["data_dir"].replace("{app_id}", values["app_id"])
        settings = cls(**values)
        settings._check_topic_names()
        settings._check_flow()
        settings._check_replication()
        settings._check_kafka_security()
        settings._check_tracing()
        return settings

    def _check_tracing(self) -> None:
        try:
            exporter_entry_points(self.traces_exporter, self.traces_protocol)
        except ValueError as exc:
            variable = "OTEL_EXPORTER_OTLP_" + ("TRACES_PROTOCOL" if self.otlp_traces_protocol else "PROTOCOL")
            raise SettingsError(f"{variable}={self.traces_protocol!r} is invalid: {exc}") from None

    @property
    def traces_protocol(self) -> str:
        """The OTLP protocol for traces: the traces-only variable, else the general one, else http/protobuf."""
        return self.otlp_traces_protocol or self.otlp_protocol or DEFAULT_PROTOCOL

    @property
    def span_exporters(self) -> tuple[str, ...]:
        """Entry point names of the span exporters to run (none when tracing is off)."""
        if self.otel_sdk_disabled:
            return ()
        return exporter_entry_points(self.traces_exporter, self.traces_protocol)

    def _check_kafka_security(self) -> None:
        try:
            self.kafka_security.check()
        except SecurityError as exc:
            raise SettingsError(str(exc)) from None

    @cached_property
    def kafka_security(self) -> KafkaSecurity:
        """How every Kafka client connects (DLQ_KAFKA_SECURITY_PROTOCOL and the rest)."""
        return KafkaSecurity(
            protocol=self.kafka_security_protocol,
            mechanism=self.kafka_sasl_mechanism,
            username=self.kafka_sasl_username,
            password=self.kafka_sasl_password,
            password_file=self.kafka_sasl_password_file,
            cafile=self.kafka_ssl_cafile,
            certfile=self.kafka_ssl_certfile,
            keyfile=self.kafka_ssl_keyfile,
            check_hostname=self.kafka_ssl_check_hostname,
        )

    @property
    def exactly_once(self) -> bool:
        return self.processing_guarantee == "exactly_once"

    def named_models(self) -> frozenset[str]:
        """The models these settings name: priced, budgeted, rate-limited, the default, the fallback."""
        budgeted = {key.removeprefix("model:") for key in self.budgets.entries if key.startswith("model:")}
        named = {*self.prices.prices, *budgeted, *self.rate_limits.by_model, self.default_model, self.fallback_model}
        return frozenset(name for name in named if name and name != "*")

    def kafka_client(self, **extra: Any) -> dict[str, Any]:
        """Keyword arguments of an aiokafka client of this deployment: the bootstrap
        servers and the security options, plus `extra`."""
        return {"bootstrap_servers": self.kafka_bootstrap, **self.kafka_security.client_options(), **extra}

    def _check_flow(self) -> None:
        if self.concurrency_floor > self.concurrency:
            raise SettingsError(
                f"DLQ_CONCURRENCY_FLOOR={self.concurrency_floor} is invalid: it must not exceed DLQ_CONCURRENCY "
                f"({self.concurrency})"
            )

    def _check_replication(self) -> None:
        wanted = self.min_insync_replicas_setting
        if wanted is not None and not 1 <= wanted <= self.replication_factor:
            raise SettingsError(
                f"DLQ_MIN_INSYNC_REPLICAS={wanted} must be from 1 to DLQ_REPLICATION_FACTOR={self.replication_factor} "
                "(more in-sync replicas than replicas would refuse every write)"
            )

    @property
    def min_insync_replicas(self) -> int:
        """`min.insync.replicas` of dlqapp's topics: the setting, or min(2, replication factor)."""
        return self.min_insync_replicas_setting or min(2, self.replication_factor)

    def _check_topic_names(self) -> None:
        if "{delay}" not in self.retry_topic_template:
            raise SettingsError("DLQ_RETRY_TOPIC_TEMPLATE must contain {delay}")
        names = self.all_topics()
        for name in names:
            if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", name):
                raise SettingsError(
                    f"topic name {name!r} is not a valid Kafka topic name: "
                    "check DLQ_TOPIC_PREFIX and the DLQ_*_TOPIC settings"
                )
        if len(set(names)) != len(names):
            raise SettingsError(f"topic names must differ: {names} (check DLQ_*_TOPIC and DLQ_RETRY_DELAYS)")

    def topic(self, name: str) -> str:
        """A topic name with the prefix applied."""
        return f"{self.topic_prefix}{name}"

    @property
    def input(self) -> str:
        return self.topic(self.input_topic)

    @property
    def dlq(self) -> str:
        return self.topic(self.dlq_topic)

    @property
    def results(self) -> str:
        return self.topic(self.results_topic)

    @property
    def due(self) -> str:
        return self.topic(self.due_topic)

    @property
    def commands(self) -> str:
        return self.topic(self.commands_topic)

    @property
    def retry_topics(self) -> tuple[str, ...]:
        """Tier topics in order, named after their delays (`retry-1s`, `retry-10s`, …)."""
        return tuple(
            self.topic(self.retry_topic_template.format(delay=format_duration(d))) for d in self.retry_delays_ms
        )

    @property
    def tiers(self) -> tuple[Tier, ...]:
        """The retry tiers, in order."""
        return build_tiers(self.retry_delays_ms, self.retry_topics, self.topic_prefix)

    def breaker_config(self) -> BreakerConfig:
        """The circuit breaker's configuration."""
        return BreakerConfig(
            window_ms=self.breaker_window_ms,
            min_calls=self.breaker_min_calls,
            failure_ratio=self.breaker_failure_ratio,
            consecutive=self.breaker_consecutive,
            enabled=self.breaker_enabled,
            open_ms=self.breaker_open_ms,
            max_open_ms=self.breaker_max_open_ms,
            probes=self.breaker_probes,
        )

    @property
    def written_record_bytes(self) -> int:
        """The largest record dlqapp writes to a topic: an input record (DLQ_MAX_MESSAGE_BYTES)
        with dlqapp's headers beside it. The max.message.bytes of every topic but `input`."""
        return record_bytes(self.max_message_bytes)

    @property
    def table_record_bytes(self) -> int:
        """The largest table record (a changelog's max.message.bytes): a DLQ entry holds its
        payload (up to DLQ_MAX_PAYLOAD_BYTES) as text or base64, and its headers twice."""
        return table_bytes(self.max_message_bytes, self.max_payload_bytes)

    @property
    def producer_request_bytes(self) -> int:
        """The producers' max request size: the largest record and a batch's framing."""
        return self.table_record_bytes + 64 * 1024

    def all_topics(self) -> list[str]:
        """Every topic dlqapp creates and consumes."""
        return [self.input, *self.retry_topics, self.dlq, self.results, self.due, self.commands]

    @property
    def retryable(self) -> dict[ErrorClass, bool]:
        """The retryable table: defaults with `DLQ_RETRYABLE` applied."""
        return {**DEFAULT_RETRYABLE, **self.retryable_overrides}

    @property
    def dead_letter_log(self) -> str:
        return self.dlq_log_path or os.path.join(self.data_dir, "dead-letters.jsonl")


SETTINGS: list[tuple[str, str, str]] = [
    (f.metadata["env"], f.metadata["default"], f.metadata["doc"]) for f in fields(Settings)
]
"""(variable, default, meaning) for every setting, in definition order."""


def markdown_table() -> str:
    """The README's settings table (`python -m dlqapp.settings` prints it)."""
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for env, default, doc in SETTINGS:
        rows.append(f"| `{env}` | {f'`{default}`' if default else '(empty)'} | {doc} |")
    return "\n".join(rows)
