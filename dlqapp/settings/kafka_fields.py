"""Where dlqapp runs: the Kafka cluster, how it connects, its topics and their shape."""

from __future__ import annotations

from dataclasses import dataclass

from dlqapp.settings.kafka_security import MECHANISMS, PROTOCOLS, Secret
from dlqapp.settings.parsing import _optional_int, _parse_bool, _positive_int, _upper_choice, parse_duration_ms, setting


@dataclass(frozen=True)
class KafkaFields:
    """Settings of one concern; `Settings` gathers them (see model.py)."""

    app_id: str = setting(
        "DLQ_APP_ID", "dlqapp", str, "Faust app id: the consumer group and the prefix of internal topics."
    )
    kafka_bootstrap: str = setting(
        "DLQ_KAFKA_BOOTSTRAP", "127.0.0.1:9092", str, "Kafka bootstrap servers, comma-separated host:port."
    )
    kafka_security_protocol: str = setting(
        "DLQ_KAFKA_SECURITY_PROTOCOL",
        "PLAINTEXT",
        _upper_choice(*PROTOCOLS),
        "How every Kafka client connects: `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL` (Kafka's names).",
    )
    kafka_sasl_mechanism: str = setting(
        "DLQ_KAFKA_SASL_MECHANISM",
        "",
        _upper_choice("", *MECHANISMS),
        "SASL mechanism with a SASL protocol: `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.",
    )
    kafka_sasl_username: str = setting("DLQ_KAFKA_SASL_USERNAME", "", str, "SASL user name.")
    kafka_sasl_password: Secret = setting(
        "DLQ_KAFKA_SASL_PASSWORD",
        "",
        Secret,
        "SASL password (never logged or shown); or use DLQ_KAFKA_SASL_PASSWORD_FILE.",
    )
    kafka_sasl_password_file: str = setting(
        "DLQ_KAFKA_SASL_PASSWORD_FILE",
        "",
        str,
        "File holding the SASL password, read at start (a mounted Kubernetes secret); a trailing newline is dropped.",
    )
    kafka_ssl_cafile: str = setting(
        "DLQ_KAFKA_SSL_CAFILE",
        "",
        str,
        "PEM file of the CA certificates that signed the brokers' (empty: the system's CAs).",
    )
    kafka_ssl_certfile: str = setting(
        "DLQ_KAFKA_SSL_CERTFILE", "", str, "PEM client certificate, for mutual TLS (with DLQ_KAFKA_SSL_KEYFILE)."
    )
    kafka_ssl_keyfile: str = setting(
        "DLQ_KAFKA_SSL_KEYFILE", "", str, "PEM private key of the client certificate (unencrypted)."
    )
    kafka_ssl_check_hostname: bool = setting(
        "DLQ_KAFKA_SSL_CHECK_HOSTNAME",
        "true",
        _parse_bool,
        "Check that a broker's certificate names the host connected to; `false` only by choice (logged as a warning "
        "at start).",
    )
    topic_prefix: str = setting("DLQ_TOPIC_PREFIX", "", str, "Prefix applied to every topic name below.")
    input_topic: str = setting("DLQ_INPUT_TOPIC", "input", str, "Topic of incoming inference requests.")
    retry_topic_template: str = setting(
        "DLQ_RETRY_TOPIC_TEMPLATE",
        "retry-{delay}",
        str,
        "Name of each retry tier topic; `{delay}` becomes the tier delay (`1s`).",
    )
    dlq_topic: str = setting("DLQ_DLQ_TOPIC", "dlq", str, "Dead-letter topic (compacted, keyed by request id).")
    results_topic: str = setting(
        "DLQ_RESULTS_TOPIC", "results", str, "Topic of successful results, keyed by request id."
    )
    commands_topic: str = setting(
        "DLQ_COMMANDS_TOPIC",
        "dlqapp-commands",
        str,
        "Internal topic that carries operator commands (replay, discard) to the worker owning the request.",
    )
    due_topic: str = setting(
        "DLQ_DUE_TOPIC",
        "dlqapp-due",
        str,
        "Internal topic on which the retry timer hands due retries to the due agent.",
    )
    session_timeout_ms: int = setting(
        "DLQ_SESSION_TIMEOUT",
        "15s",
        parse_duration_ms,
        "Kafka consumer session timeout: how soon a dead worker's partitions move to the others.",
    )
    partitions: int = setting(
        "DLQ_PARTITIONS",
        "12",
        _positive_int,
        "Partitions of every dlqapp topic (all must match): at most this many workers share the load; grow a stopped "
        "deployment with `grow-partitions`.",
    )
    replication_factor: int = setting(
        "DLQ_REPLICATION_FACTOR",
        "1",
        _positive_int,
        "Replication factor of the topics dlqapp creates, Faust's changelogs included (3 on a production cluster); a "
        "worker refuses to create topics on fewer brokers.",
    )
    min_insync_replicas_setting: int | None = setting(
        "DLQ_MIN_INSYNC_REPLICAS",
        "",
        _optional_int,
        "`min.insync.replicas` of dlqapp's topics and changelogs: replicas that must have a write before it counts "
        "(empty: the smaller of 2 and DLQ_REPLICATION_FACTOR). Existing topics are brought to it at start.",
    )
