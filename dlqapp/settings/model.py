"""Every dlqapp setting: its environment variable, type, default and meaning.

This module is the one place settings are defined. `Settings.from_env()` reads them,
validates each one, and raises `SettingsError` naming the variable to fix. The settings
table of docs/settings.md is generated from it (`scripts/readme-settings`) and checked by a test.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

from dlqapp.core.breaker import BreakerConfig
from dlqapp.core.budgets import BudgetTable, clean_tenant
from dlqapp.core.errors import DEFAULT_RETRYABLE, ErrorClass
from dlqapp.core.prices import PriceTable, read_prices_setting
from dlqapp.core.tiers import Tier, build_tiers
from dlqapp.flowcontrol.limits import RateLimits, parse_rate_limits
from dlqapp.settings.kafka_security import MECHANISMS, PROTOCOLS, KafkaSecurity, Secret, SecurityError
from dlqapp.settings.parsing import (
    MIN_TOKEN_CHARS,
    _admin_token,
    _choice,
    _name_list,
    _optional_int,
    _parse_bool,
    _parse_delays,
    _parse_rate,
    _parse_retryable,
    _port,
    _positive_duration,
    _positive_int,
    _upper_choice,
    format_duration,
    parse_duration_ms,
)
from dlqapp.settings.tracing import DEFAULT_PROTOCOL, exporter_entry_points, parse_exporters, parse_protocol

RECORD_HEADROOM_BYTES = 1024 * 1024
"""Room for dlqapp's own headers beside a record's bytes (attempt history, errors, the original
headers of an invalid record: each bounded well below it)."""


def record_bytes(input_bytes: int) -> int:
    """The largest record dlqapp writes to a topic for an input record of `input_bytes`."""
    return input_bytes + RECORD_HEADROOM_BYTES


def table_bytes(input_bytes: int, max_payload_bytes: int) -> int:
    """The largest table record for an input record of `input_bytes` (see Settings.table_record_bytes)."""
    return input_bytes + min(input_bytes, max_payload_bytes) // 2 + 2 * RECORD_HEADROOM_BYTES


def _parse_weights(text: str) -> dict[str, float]:
    """DLQ_TENANT_WEIGHTS: a JSON object of tenant -> positive number."""
    if not text.strip():
        return {}
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError("must be a JSON object: tenant -> weight")
    weights = {}
    for tenant, weight in raw.items():
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight <= 0:
            raise ValueError(f"{tenant}: a weight is a number > 0")
        weights[_tenant_name(tenant)] = float(weight)
    return weights


def _tenant_name(text: str) -> str:
    name = clean_tenant(text)
    if name is None or name != text:
        raise ValueError("a tenant name is 1-64 characters of letters, digits and ._:@/-")
    return name


class SettingsError(ValueError):
    """A setting has an invalid value; the message names its environment variable."""


def _setting(env: str, default: str, parse: Callable[[str], Any], doc: str) -> Any:
    return field(metadata={"env": env, "default": default, "parse": parse, "doc": doc})


@dataclass(frozen=True)
class Settings:
    """Validated settings. Build with `Settings.from_env()`; each field documents itself."""

    app_id: str = _setting(
        "DLQ_APP_ID", "dlqapp", str, "Faust app id: the consumer group and the prefix of internal topics."
    )
    kafka_bootstrap: str = _setting(
        "DLQ_KAFKA_BOOTSTRAP", "127.0.0.1:9092", str, "Kafka bootstrap servers, comma-separated host:port."
    )
    kafka_security_protocol: str = _setting(
        "DLQ_KAFKA_SECURITY_PROTOCOL",
        "PLAINTEXT",
        _upper_choice(*PROTOCOLS),
        "How every Kafka client connects: `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL` (Kafka's names).",
    )
    kafka_sasl_mechanism: str = _setting(
        "DLQ_KAFKA_SASL_MECHANISM",
        "",
        _upper_choice("", *MECHANISMS),
        "SASL mechanism with a SASL protocol: `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.",
    )
    kafka_sasl_username: str = _setting("DLQ_KAFKA_SASL_USERNAME", "", str, "SASL user name.")
    kafka_sasl_password: Secret = _setting(
        "DLQ_KAFKA_SASL_PASSWORD",
        "",
        Secret,
        "SASL password (never logged or shown); or use DLQ_KAFKA_SASL_PASSWORD_FILE.",
    )
    kafka_sasl_password_file: str = _setting(
        "DLQ_KAFKA_SASL_PASSWORD_FILE",
        "",
        str,
        "File holding the SASL password, read at start (a mounted Kubernetes secret); a trailing newline is dropped.",
    )
    kafka_ssl_cafile: str = _setting(
        "DLQ_KAFKA_SSL_CAFILE",
        "",
        str,
        "PEM file of the CA certificates that signed the brokers' (empty: the system's CAs).",
    )
    kafka_ssl_certfile: str = _setting(
        "DLQ_KAFKA_SSL_CERTFILE", "", str, "PEM client certificate, for mutual TLS (with DLQ_KAFKA_SSL_KEYFILE)."
    )
    kafka_ssl_keyfile: str = _setting(
        "DLQ_KAFKA_SSL_KEYFILE", "", str, "PEM private key of the client certificate (unencrypted)."
    )
    kafka_ssl_check_hostname: bool = _setting(
        "DLQ_KAFKA_SSL_CHECK_HOSTNAME",
        "true",
        _parse_bool,
        "Check that a broker's certificate names the host connected to; `false` only by choice (logged as a warning "
        "at start).",
    )
    topic_prefix: str = _setting("DLQ_TOPIC_PREFIX", "", str, "Prefix applied to every topic name below.")
    input_topic: str = _setting("DLQ_INPUT_TOPIC", "input", str, "Topic of incoming inference requests.")
    retry_topic_template: str = _setting(
        "DLQ_RETRY_TOPIC_TEMPLATE",
        "retry-{delay}",
        str,
        "Name of each retry tier topic; `{delay}` becomes the tier delay (`1s`).",
    )
    dlq_topic: str = _setting("DLQ_DLQ_TOPIC", "dlq", str, "Dead-letter topic (compacted, keyed by request id).")
    results_topic: str = _setting(
        "DLQ_RESULTS_TOPIC", "results", str, "Topic of successful results, keyed by request id."
    )
    commands_topic: str = _setting(
        "DLQ_COMMANDS_TOPIC",
        "dlqapp-commands",
        str,
        "Internal topic that carries operator commands (replay, discard) to the worker owning the request.",
    )
    due_topic: str = _setting(
        "DLQ_DUE_TOPIC",
        "dlqapp-due",
        str,
        "Internal topic on which the retry timer hands due retries to the due agent.",
    )
    session_timeout_ms: int = _setting(
        "DLQ_SESSION_TIMEOUT",
        "15s",
        parse_duration_ms,
        "Kafka consumer session timeout: how soon a dead worker's partitions move to the others.",
    )
    partitions: int = _setting(
        "DLQ_PARTITIONS",
        "12",
        _positive_int,
        "Partitions of every dlqapp topic (all must match): at most this many workers share the load; grow a stopped "
        "deployment with `grow-partitions`.",
    )
    replication_factor: int = _setting(
        "DLQ_REPLICATION_FACTOR",
        "1",
        _positive_int,
        "Replication factor of the topics dlqapp creates, Faust's changelogs included (3 on a production cluster); a "
        "worker refuses to create topics on fewer brokers.",
    )
    min_insync_replicas_setting: int | None = _setting(
        "DLQ_MIN_INSYNC_REPLICAS",
        "",
        _optional_int,
        "`min.insync.replicas` of dlqapp's topics and changelogs: replicas that must have a write before it counts "
        "(empty: the smaller of 2 and DLQ_REPLICATION_FACTOR). Existing topics are brought to it at start.",
    )
    retry_delays_ms: tuple[int, ...] = _setting(
        "DLQ_RETRY_DELAYS", "1s,10s,1m", _parse_delays, "Delay of each retry tier; one tier topic per delay."
    )
    backoff: str = _setting(
        "DLQ_BACKOFF",
        "tiers",
        _choice("tiers", "exponential"),
        "`tiers`: each tier waits its delay exactly. `exponential`: first delay × 2^(k-1) with jitter, still through "
        "the tier topics.",
    )
    backoff_jitter: float = _setting(
        "DLQ_BACKOFF_JITTER", "0.2", _parse_rate, "Fraction of an exponential delay that is randomised (0 to 1)."
    )
    max_age_ms: int = _setting(
        "DLQ_MAX_AGE",
        "24h",
        parse_duration_ms,
        "A request older than this at attempt time is dead-lettered as `expired`.",
    )
    retryable_overrides: dict = _setting(
        "DLQ_RETRYABLE",
        "",
        _parse_retryable,
        "Overrides of the retryable table, e.g. `context_length=true,unknown=false`.",
    )
    max_message_bytes: int = _setting(
        "DLQ_MAX_MESSAGE_BYTES",
        "16777216",
        _positive_int,
        "Largest record producers may write to `input` (the input topic's max.message.bytes). dlqapp's other "
        "topics take it plus 1 MiB for dlqapp's headers (table changelogs a little more), so any record the "
        "input accepts reaches the DLQ with its bytes intact; a worker refuses to start when existing topics "
        "cannot hold that.",
    )
    max_payload_bytes: int = _setting(
        "DLQ_MAX_PAYLOAD_BYTES",
        "1048576",
        _positive_int,
        "Largest accepted request payload; larger ones are dead-lettered as `invalid_request`.",
    )
    concurrency: int = _setting(
        "DLQ_CONCURRENCY",
        "64",
        _positive_int,
        "Backend calls in flight at once per worker (the most the adaptive limit may reach).",
    )
    adaptive_concurrency: bool = _setting(
        "DLQ_ADAPTIVE_CONCURRENCY",
        "true",
        _parse_bool,
        "Shrink the calls in flight when the backend answers 429s, times out or slows down, and grow them back when "
        "it recovers (AIMD between DLQ_CONCURRENCY_FLOOR and DLQ_CONCURRENCY).",
    )
    concurrency_floor: int = _setting(
        "DLQ_CONCURRENCY_FLOOR",
        "1",
        _positive_int,
        "Adaptive concurrency never goes below this many calls in flight (at most DLQ_CONCURRENCY).",
    )
    rate_limits: RateLimits = _setting(
        "DLQ_RATE_LIMITS",
        "",
        parse_rate_limits,
        "Requests and tokens per minute per model, e.g. "
        "`gpt-4o-mini=5000rpm/2000000tpm,gpt-4o=500rpm/30000tpm,*=1000rpm`; calls wait for capacity instead of being "
        "sent. Each worker takes the share of its input partitions (empty: no limits).",
    )
    prices: PriceTable = _setting(
        "DLQ_PRICES",
        "",
        read_prices_setting,
        'Prices per model in USD per million tokens, JSON or the path of a JSON file: `{"gpt-4o-mini": {"input": 0.15, '
        '"cached_input": 0.075, "output": 0.6}}`; `*` prices every model not named. A model without a price is '
        "counted in tokens only (flagged `unpriced`) and no USD budget holds it (docs/costs.md).",
    )
    budgets: BudgetTable = _setting(
        "DLQ_BUDGETS",
        "",
        BudgetTable.parse,
        'Budgets per UTC day and month, JSON: `{"acme": {"day_usd": 50, "month_usd": 1000}, "*": {"day_usd": 5}}` '
        "(`*`: each tenant without an entry; `model:<name>`: a model, all tenants together). A request over its "
        "budget is held (`budget_held`), never dropped. `POST /budgets/` changes them at run time.",
    )
    tenant_weights: dict[str, float] = _setting(
        "DLQ_TENANT_WEIGHTS",
        "",
        _parse_weights,
        'Weights of tenants\' fair shares of backend slots, JSON: `{"acme": 3, "beta": 1}` (1 for a tenant not named).',
    )
    read_ahead: int = _setting(
        "DLQ_READ_AHEAD",
        "10000",
        _positive_int,
        "Fresh requests a worker reads ahead while its backend slots are busy, to share them fairly between "
        "tenants (`DLQ_TENANT_WEIGHTS`): a tenant's request read behind another tenant's flood of this many starts "
        "within a round. Its offsets are committed only once the flood before it is done. Memory: about its "
        "payloads' size.",
    )
    default_tenant: str = _setting(
        "DLQ_DEFAULT_TENANT",
        "default",
        _tenant_name,
        "The tenant of a request whose `metadata.tenant` (and `tenant` header) names none.",
    )
    budget_recheck_ms: int = _setting(
        "DLQ_BUDGET_RECHECK",
        "30s",
        _positive_duration,
        "How often a request held over its budget is looked at again (also at each UTC midnight, and at once when "
        "`POST /budgets/` raises a budget).",
    )
    max_poll_records: int = _setting(
        "DLQ_MAX_POLL_RECORDS",
        "100",
        _positive_int,
        "Most records one consumer poll hands to the agents; small batches let due retries through a flood of input.",
    )
    fetch_max_wait_ms: int = _setting(
        "DLQ_FETCH_MAX_WAIT",
        "50ms",
        parse_duration_ms,
        "Longest the consumer's fetch waits at the broker for new records. A due retry written while a fetch that "
        "does not include its partition is waiting is read only after that fetch returns "
        "(Faust fixes this wait at 1.5 s).",
    )
    processing_guarantee: str = _setting(
        "DLQ_PROCESSING_GUARANTEE",
        "exactly_once",
        _choice("at_least_once", "exactly_once"),
        "`exactly_once`: every output of a partition's stream steps (results, dead letters, retries, state) is "
        "written in one Kafka transaction per DLQ_COMMIT_INTERVAL, so a `read_committed` consumer of `results` and "
        "`dlq` sees exactly one outcome per request; `at_least_once`: outcomes are confirmed one by one, and a crash "
        "can repeat one.",
    )
    commit_interval_ms: int = _setting(
        "DLQ_COMMIT_INTERVAL",
        "100ms",
        _positive_duration,
        "Under `exactly_once`: how often each partition's transaction commits (a step is acked once its transaction "
        "has committed).",
    )
    transaction_timeout_ms: int = _setting(
        "DLQ_TRANSACTION_TIMEOUT",
        "10s",
        _positive_duration,
        "Under `exactly_once`: the broker aborts a transaction left open this long (a frozen worker's); a commit "
        "that takes longer restarts the worker in place (its tables rebuilt from the changelogs).",
    )
    drain_timeout_ms: int = _setting(
        "DLQ_DRAIN_TIMEOUT",
        "5s",
        parse_duration_ms,
        "On shutdown or a rebalance, how long calls in flight may finish; the rest (and requests held by the "
        "breaker) are left unacked for the partition's next owner.",
    )
    poison_after_crashes: int = _setting(
        "DLQ_POISON_AFTER_CRASHES",
        "3",
        _positive_int,
        "A message the worker died on (in progress at this many unclean stops in a row) is dead-lettered as `poison` "
        "instead of being handled again.",
    )
    timer_interval_ms: int = _setting(
        "DLQ_TIMER_INTERVAL", "20ms", parse_duration_ms, "How often the retry timer scans for due retries."
    )
    due_lead_max_ms: int = _setting(
        "DLQ_DUE_LEAD_MAX",
        "1s",
        parse_duration_ms,
        "The retry timer hands a retry to the due agent ahead of its due time: 1.5 x the slowest hand-over of the "
        "last 30-60 s, at least 500 ms, at most this long; the attempt itself never starts before the due time. "
        "0: hand retries over when due.",
    )
    timer_batch: int = _setting(
        "DLQ_TIMER_BATCH", "500", _positive_int, "Most due retries the timer hands over per partition per tick."
    )
    inference: str = _setting(
        "DLQ_INFERENCE",
        "simulated",
        _choice("simulated", "openai"),
        "Inference backend: `simulated` (in-process) or `openai` (an OpenAI-compatible HTTP endpoint).",
    )
    fallback_model: str = _setting(
        "DLQ_FALLBACK_MODEL",
        "",
        str,
        "After the last tier fails, or on `context_length`, one attempt on this model before the DLQ (empty: none).",
    )
    breaker_enabled: bool = _setting(
        "DLQ_BREAKER",
        "true",
        _parse_bool,
        "Circuit breaker for backend-wide failures (outages hold requests instead of spending attempts).",
    )
    breaker_window_ms: int = _setting(
        "DLQ_BREAKER_WINDOW",
        "10s",
        _positive_duration,
        "Breaker: the time window whose calls it judges (the same at any throughput).",
    )
    breaker_min_calls: int = _setting(
        "DLQ_BREAKER_MIN_CALLS",
        "50",
        _positive_int,
        "Breaker: calls the window must hold before their failure ratio may open it.",
    )
    breaker_failure_ratio: float = _setting(
        "DLQ_BREAKER_FAILURE_RATIO",
        "0.5",
        _parse_rate,
        "Breaker: share of backend-wide failures in the window that opens it.",
    )
    breaker_consecutive: int = _setting(
        "DLQ_BREAKER_CONSECUTIVE",
        "15",
        _positive_int,
        "Breaker: this many backend-wide failures of fresh requests in a row open it at once (a hard outage, "
        "whatever the window holds).",
    )
    breaker_open_ms: int = _setting(
        "DLQ_BREAKER_OPEN", "5s", parse_duration_ms, "Breaker: first pause before probing (doubles on each re-open)."
    )
    breaker_max_open_ms: int = _setting(
        "DLQ_BREAKER_MAX_OPEN", "60s", parse_duration_ms, "Breaker: longest pause between probes."
    )
    breaker_probes: int = _setting(
        "DLQ_BREAKER_PROBES",
        "3",
        _positive_int,
        "Breaker: half-open probe calls judged before deciding; it re-opens once DLQ_BREAKER_FAILURE_RATIO of them "
        "failed, and closes once that can no longer happen.",
    )
    default_model: str = _setting("DLQ_DEFAULT_MODEL", "sim-small", str, "Model used when a request names none.")
    simulated_success_rate: float = _setting(
        "DLQ_SIMULATED_SUCCESS_RATE", "0.8", _parse_rate, "Simulated backend: share of calls that succeed."
    )
    simulated_seed: int | None = _setting(
        "DLQ_SIMULATED_SEED", "", _optional_int, "Simulated backend: random seed (empty: unseeded)."
    )
    simulated_latency_ms: int = _setting(
        "DLQ_SIMULATED_LATENCY", "20ms", parse_duration_ms, "Simulated backend: mean call latency."
    )
    simulated_jitter_ms: int = _setting(
        "DLQ_SIMULATED_JITTER", "10ms", parse_duration_ms, "Simulated backend: latency jitter (uniform ±)."
    )
    call_log_size: int = _setting(
        "DLQ_CALL_LOG_SIZE",
        "100000",
        _positive_int,
        "Request ids whose backend call counts a worker keeps for `/inference/calls/{id}/` (the oldest are forgotten).",
    )
    inference_url: str = _setting(
        "DLQ_INFERENCE_URL", "http://127.0.0.1:8000/v1", str, "`openai` backend: base URL of an OpenAI-compatible API."
    )
    inference_api_key: str = _setting(
        "DLQ_INFERENCE_API_KEY", "", str, "`openai` backend: API key sent as a bearer token."
    )
    inference_timeout_ms: int = _setting(
        "DLQ_INFERENCE_TIMEOUT", "60s", parse_duration_ms, "Timeout of one backend call."
    )
    data_dir: str = _setting(
        "DLQ_DATA_DIR",
        "{app_id}-data",
        str,
        "Worker state: RocksDB tables and the dead-letter log (`{app_id}` is replaced).",
    )
    table_write_buffer_bytes: int = _setting(
        "DLQ_TABLE_WRITE_BUFFER_BYTES",
        "4194304",
        _positive_int,
        "Size of one RocksDB write buffer (memtable) of a table partition.",
    )
    table_memtable_budget_bytes: int = _setting(
        "DLQ_TABLE_MEMTABLE_BUDGET_BYTES",
        "67108864",
        _positive_int,
        "RocksDB write buffers of every table partition of a worker together; past it memtables are flushed early.",
    )
    table_cache_bytes: int = _setting(
        "DLQ_TABLE_CACHE_BYTES",
        "67108864",
        _positive_int,
        "RocksDB block cache shared by every table partition of a worker (index and filter blocks included): memory "
        "for reads.",
    )
    state_retention_ms: int = _setting(
        "DLQ_STATE_RETENTION",
        "7d",
        parse_duration_ms,
        "How long a settled request (succeeded or discarded) and an old replay ledger are kept; dedup remembers a "
        "succeeded id this long after its last change.",
    )
    dlq_log_max_bytes: int = _setting(
        "DLQ_LOG_MAX_BYTES", "67108864", _positive_int, "The dead-letter JSON-lines log rotates at this size."
    )
    dlq_log_backups: int = _setting(
        "DLQ_LOG_BACKUPS", "5", _positive_int, "Rotated dead-letter logs kept (`dead-letters.jsonl.1` is the newest)."
    )
    dlq_log_path: str = _setting(
        "DLQ_LOG_PATH", "", str, "JSON-lines file of dead letters (empty: <DLQ_DATA_DIR>/dead-letters.jsonl)."
    )
    web_host: str = _setting("DLQ_WEB_HOST", "127.0.0.1", str, "Address the worker's HTTP server binds.")
    web_port: int = _setting("DLQ_WEB_PORT", "6066", _port, "Port of the worker's HTTP server.")
    web_url: str = _setting(
        "DLQ_WEB_URL", "http://127.0.0.1:6066", str, "URL of a running worker, used by the CLI commands."
    )
    web_advertised_url: str = _setting(
        "DLQ_WEB_ADVERTISED_URL",
        "",
        str,
        "URL other workers use to reach this one (empty: http://<DLQ_WEB_HOST or hostname>:<port>).",
    )
    max_body_bytes: int = _setting(
        "DLQ_MAX_BODY_BYTES", "4194304", _positive_int, "Largest HTTP request body accepted; larger ones get 413."
    )
    max_replays: int = _setting(
        "DLQ_MAX_REPLAYS", "5", _positive_int, "Replays allowed per request id; more are refused (stops replay loops)."
    )
    alert_webhook_url: str = _setting(
        "DLQ_ALERT_WEBHOOK_URL", "", str, "Slack-compatible webhook for dead-letter alerts (empty: log lines only)."
    )
    alert_window_ms: int = _setting(
        "DLQ_ALERT_WINDOW", "10s", parse_duration_ms, "Dead letters are batched into one webhook message per window."
    )
    admin_token: str = _setting(
        "DLQ_ADMIN_TOKEN",
        "",
        _admin_token,
        f"Bearer token required for mutations, at least {MIN_TOKEN_CHARS} characters (empty: loopback clients only).",
    )
    allowed_hosts: tuple[str, ...] = _setting(
        "DLQ_ALLOWED_HOSTS",
        "",
        _name_list,
        "Extra host names the HTTP server answers to, comma-separated (IP addresses, loopback names, the advertised "
        "host and this machine's name always work; others are refused against DNS rebinding).",
    )
    allowed_origins: tuple[str, ...] = _setting(
        "DLQ_ALLOWED_ORIGINS",
        "",
        _name_list,
        "Extra browser origins (`https://ops.example.com`) allowed to send mutations; the worker's own origin always "
        "is.",
    )
    log_level: str = _setting(
        "DLQ_LOG_LEVEL", "info", _choice("debug", "info", "warning", "error"), "Level of dlqapp's own loggers."
    )
    log_format: str = _setting(
        "DLQ_LOG_FORMAT", "text", _choice("text", "json"), "`text`: key=value lines. `json`: one JSON object per line."
    )
    producer_linger_ms: int = _setting(
        "DLQ_PRODUCER_LINGER",
        "5ms",
        parse_duration_ms,
        "How long the worker's Kafka producer waits to batch sends (results, retries, table changelogs) into one "
        "request; 0 sends each at once.",
    )
    event_loop: str = _setting(
        "DLQ_EVENT_LOOP",
        "uvloop",
        _choice("uvloop", "asyncio"),
        "Event loop of the worker: `uvloop` (faster; the default) or Python's own `asyncio`.",
    )
    otel_sdk_disabled: bool = _setting(
        "OTEL_SDK_DISABLED",
        "false",
        lambda text: text.strip().lower() == "true",
        "OpenTelemetry's switch: `true` turns tracing off whatever OTEL_TRACES_EXPORTER says.",
    )
    traces_exporter: tuple[str, ...] = _setting(
        "OTEL_TRACES_EXPORTER",
        "none",
        parse_exporters,
        "Where spans go (one span per attempt and per replay, docs/operations.md#traces): `otlp`, `console`, or "
        "another installed OpenTelemetry span exporter, comma-separated; `none`: no spans, a request's "
        "`traceparent` is still carried on. The SDK reads the rest: OTEL_EXPORTER_OTLP_ENDPOINT (or "
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), OTEL_EXPORTER_OTLP_HEADERS, OTEL_TRACES_SAMPLER, OTEL_BSP_*, ...",
    )
    otlp_protocol: str = _setting(
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "",
        parse_protocol,
        f"Protocol of the `otlp` exporter: `http/protobuf` (empty: {DEFAULT_PROTOCOL}) or `grpc` (needs "
        "opentelemetry-exporter-otlp-proto-grpc installed).",
    )
    otlp_traces_protocol: str = _setting(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "",
        parse_protocol,
        "The same for traces only; wins over OTEL_EXPORTER_OTLP_PROTOCOL.",
    )
    otel_service_name: str = _setting(
        "OTEL_SERVICE_NAME",
        "",
        str,
        "`service.name` of the spans (empty: the one in OTEL_RESOURCE_ATTRIBUTES, else `dlqapp`).",
    )

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
