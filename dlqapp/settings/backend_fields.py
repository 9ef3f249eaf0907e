"""The inference backend: which, its fallback, the circuit breaker, the simulated backend, the HTTP one."""

from __future__ import annotations

from dataclasses import dataclass

from dlqapp.settings.parsing import (
    _choice,
    _optional_int,
    _parse_bool,
    _parse_rate,
    _positive_duration,
    _positive_int,
    parse_duration_ms,
    setting,
)


@dataclass(frozen=True)
class BackendFields:
    """Settings of one concern; `Settings` gathers them (see model.py)."""

    inference: str = setting(
        "DLQ_INFERENCE",
        "simulated",
        _choice("simulated", "openai"),
        "Inference backend: `simulated` (in-process) or `openai` (an OpenAI-compatible HTTP endpoint).",
    )
    fallback_model: str = setting(
        "DLQ_FALLBACK_MODEL",
        "",
        str,
        "After the last tier fails, or on `context_length`, one attempt on this model before the DLQ (empty: none).",
    )
    breaker_enabled: bool = setting(
        "DLQ_BREAKER",
        "true",
        _parse_bool,
        "Circuit breaker for backend-wide failures (outages hold requests instead of spending attempts).",
    )
    breaker_window_ms: int = setting(
        "DLQ_BREAKER_WINDOW",
        "10s",
        _positive_duration,
        "Breaker: the time window whose calls it judges (the same at any throughput).",
    )
    breaker_min_calls: int = setting(
        "DLQ_BREAKER_MIN_CALLS",
        "50",
        _positive_int,
        "Breaker: calls the window must hold before their failure ratio may open it.",
    )
    breaker_failure_ratio: float = setting(
        "DLQ_BREAKER_FAILURE_RATIO",
        "0.5",
        _parse_rate,
        "Breaker: share of backend-wide failures in the window that opens it.",
    )
    breaker_consecutive: int = setting(
        "DLQ_BREAKER_CONSECUTIVE",
        "15",
        _positive_int,
        "Breaker: this many backend-wide failures of fresh requests in a row open it at once (a hard outage, "
        "whatever the window holds).",
    )
    breaker_open_ms: int = setting(
        "DLQ_BREAKER_OPEN", "5s", parse_duration_ms, "Breaker: first pause before probing (doubles on each re-open)."
    )
    breaker_max_open_ms: int = setting(
        "DLQ_BREAKER_MAX_OPEN", "60s", parse_duration_ms, "Breaker: longest pause between probes."
    )
    breaker_probes: int = setting(
        "DLQ_BREAKER_PROBES",
        "3",
        _positive_int,
        "Breaker: half-open probe calls judged before deciding; it re-opens once DLQ_BREAKER_FAILURE_RATIO of them "
        "failed, and closes once that can no longer happen.",
    )
    default_model: str = setting("DLQ_DEFAULT_MODEL", "sim-small", str, "Model used when a request names none.")
    simulated_success_rate: float = setting(
        "DLQ_SIMULATED_SUCCESS_RATE", "0.8", _parse_rate, "Simulated backend: share of calls that succeed."
    )
    simulated_seed: int | None = setting(
        "DLQ_SIMULATED_SEED", "", _optional_int, "Simulated backend: random seed (empty: unseeded)."
    )
    simulated_latency_ms: int = setting(
        "DLQ_SIMULATED_LATENCY", "20ms", parse_duration_ms, "Simulated backend: mean call latency."
    )
    simulated_jitter_ms: int = setting(
        "DLQ_SIMULATED_JITTER", "10ms", parse_duration_ms, "Simulated backend: latency jitter (uniform ±)."
    )
    call_log_size: int = setting(
        "DLQ_CALL_LOG_SIZE",
        "100000",
        _positive_int,
        "Request ids whose backend call counts a worker keeps for `/inference/calls/{id}/` (the oldest are forgotten).",
    )
    inference_url: str = setting(
        "DLQ_INFERENCE_URL", "http://127.0.0.1:8000/v1", str, "`openai` backend: base URL of an OpenAI-compatible API."
    )
    inference_api_key: str = setting(
        "DLQ_INFERENCE_API_KEY", "", str, "`openai` backend: API key sent as a bearer token."
    )
    inference_timeout_ms: int = setting(
        "DLQ_INFERENCE_TIMEOUT", "60s", parse_duration_ms, "Timeout of one backend call."
    )
