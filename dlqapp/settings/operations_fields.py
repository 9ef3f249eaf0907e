"""How dlqapp is run: local state, the dead-letter log, HTTP, alerts, access, logs and traces."""

from __future__ import annotations

from dataclasses import dataclass

from dlqapp.settings.parsing import (
    MIN_TOKEN_CHARS,
    _admin_token,
    _choice,
    _name_list,
    _port,
    _positive_int,
    parse_duration_ms,
    setting,
)
from dlqapp.settings.tracing import DEFAULT_PROTOCOL, parse_exporters, parse_protocol


@dataclass(frozen=True)
class OperationsFields:
    """Settings of one concern; `Settings` gathers them (see model.py)."""

    data_dir: str = setting(
        "DLQ_DATA_DIR",
        "{app_id}-data",
        str,
        "Worker state: RocksDB tables and the dead-letter log (`{app_id}` is replaced).",
    )
    table_write_buffer_bytes: int = setting(
        "DLQ_TABLE_WRITE_BUFFER_BYTES",
        "4194304",
        _positive_int,
        "Size of one RocksDB write buffer (memtable) of a table partition.",
    )
    table_memtable_budget_bytes: int = setting(
        "DLQ_TABLE_MEMTABLE_BUDGET_BYTES",
        "67108864",
        _positive_int,
        "RocksDB write buffers of every table partition of a worker together; past it memtables are flushed early.",
    )
    table_cache_bytes: int = setting(
        "DLQ_TABLE_CACHE_BYTES",
        "67108864",
        _positive_int,
        "RocksDB block cache shared by every table partition of a worker (index and filter blocks included): memory "
        "for reads.",
    )
    state_retention_ms: int = setting(
        "DLQ_STATE_RETENTION",
        "7d",
        parse_duration_ms,
        "How long a settled request (succeeded or discarded) and an old replay ledger are kept; dedup remembers a "
        "succeeded id this long after its last change.",
    )
    dlq_log_max_bytes: int = setting(
        "DLQ_LOG_MAX_BYTES", "67108864", _positive_int, "The dead-letter JSON-lines log rotates at this size."
    )
    dlq_log_backups: int = setting(
        "DLQ_LOG_BACKUPS", "5", _positive_int, "Rotated dead-letter logs kept (`dead-letters.jsonl.1` is the newest)."
    )
    dlq_log_path: str = setting(
        "DLQ_LOG_PATH", "", str, "JSON-lines file of dead letters (empty: <DLQ_DATA_DIR>/dead-letters.jsonl)."
    )
    web_host: str = setting("DLQ_WEB_HOST", "127.0.0.1", str, "Address the worker's HTTP server binds.")
    web_port: int = setting("DLQ_WEB_PORT", "6066", _port, "Port of the worker's HTTP server.")
    web_url: str = setting(
        "DLQ_WEB_URL", "http://127.0.0.1:6066", str, "URL of a running worker, used by the CLI commands."
    )
    web_advertised_url: str = setting(
        "DLQ_WEB_ADVERTISED_URL",
        "",
        str,
        "URL other workers use to reach this one (empty: http://<DLQ_WEB_HOST or hostname>:<port>).",
    )
    max_body_bytes: int = setting(
        "DLQ_MAX_BODY_BYTES", "4194304", _positive_int, "Largest HTTP request body accepted; larger ones get 413."
    )
    max_replays: int = setting(
        "DLQ_MAX_REPLAYS", "5", _positive_int, "Replays allowed per request id; more are refused (stops replay loops)."
    )
    alert_webhook_url: str = setting(
        "DLQ_ALERT_WEBHOOK_URL", "", str, "Slack-compatible webhook for dead-letter alerts (empty: log lines only)."
    )
    alert_window_ms: int = setting(
        "DLQ_ALERT_WINDOW", "10s", parse_duration_ms, "Dead letters are batched into one webhook message per window."
    )
    admin_token: str = setting(
        "DLQ_ADMIN_TOKEN",
        "",
        _admin_token,
        f"Bearer token required for mutations, at least {MIN_TOKEN_CHARS} characters (empty: loopback clients only).",
    )
    allowed_hosts: tuple[str, ...] = setting(
        "DLQ_ALLOWED_HOSTS",
        "",
        _name_list,
        "Extra host names the HTTP server answers to, comma-separated (IP addresses, loopback names, the advertised "
        "host and this machine's name always work; others are refused against DNS rebinding).",
    )
    allowed_origins: tuple[str, ...] = setting(
        "DLQ_ALLOWED_ORIGINS",
        "",
        _name_list,
        "Extra browser origins (`https://ops.example.com`) allowed to send mutations; the worker's own origin always "
        "is.",
    )
    log_level: str = setting(
        "DLQ_LOG_LEVEL", "info", _choice("debug", "info", "warning", "error"), "Level of dlqapp's own loggers."
    )
    log_format: str = setting(
        "DLQ_LOG_FORMAT", "text", _choice("text", "json"), "`text`: key=value lines. `json`: one JSON object per line."
    )
    producer_linger_ms: int = setting(
        "DLQ_PRODUCER_LINGER",
        "5ms",
        parse_duration_ms,
        "How long the worker's Kafka producer waits to batch sends (results, retries, table changelogs) into one "
        "request; 0 sends each at once. Under `exactly_once` a partition's records wait for its transaction's "
        "commit (DLQ_COMMIT_INTERVAL), before which no read_committed consumer sees them anyway.",
    )
    event_loop: str = setting(
        "DLQ_EVENT_LOOP",
        "uvloop",
        _choice("uvloop", "asyncio"),
        "Event loop of the worker: `uvloop` (faster; the default) or Python's own `asyncio`.",
    )
    otel_sdk_disabled: bool = setting(
        "OTEL_SDK_DISABLED",
        "false",
        lambda text: text.strip().lower() == "true",
        "OpenTelemetry's switch: `true` turns tracing off whatever OTEL_TRACES_EXPORTER says.",
    )
    traces_exporter: tuple[str, ...] = setting(
        "OTEL_TRACES_EXPORTER",
        "none",
        parse_exporters,
        "Where spans go (one span per attempt and per replay, docs/operations.md#traces): `otlp`, `console`, or "
        "another installed OpenTelemetry span exporter, comma-separated; `none`: no spans, a request's "
        "`traceparent` is still carried on. The SDK reads the rest: OTEL_EXPORTER_OTLP_ENDPOINT (or "
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), OTEL_EXPORTER_OTLP_HEADERS, OTEL_TRACES_SAMPLER, OTEL_BSP_*, ...",
    )
    otlp_protocol: str = setting(
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "",
        parse_protocol,
        f"Protocol of the `otlp` exporter: `http/protobuf` (empty: {DEFAULT_PROTOCOL}) or `grpc` (needs "
        "opentelemetry-exporter-otlp-proto-grpc installed).",
    )
    otlp_traces_protocol: str = setting(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "",
        parse_protocol,
        "The same for traces only; wins over OTEL_EXPORTER_OTLP_PROTOCOL.",
    )
    otel_service_name: str = setting(
        "OTEL_SERVICE_NAME",
        "",
        str,
        "`service.name` of the spans (empty: the one in OTEL_RESOURCE_ATTRIBUTES, else `dlqapp`).",
    )
