"""Inference backends: the interface, and a factory that picks one from settings."""

from __future__ import annotations

from dlqapp.core.backend import InferenceBackend, InferenceOutput
from dlqapp.inference.openai import OpenAIBackend
from dlqapp.inference.simulated import SimulatedBackend
from dlqapp.settings import Settings, SettingsError

__all__ = ["InferenceBackend", "InferenceOutput", "OpenAIBackend", "SimulatedBackend", "create_backend"]


def create_backend(settings: Settings) -> InferenceBackend:
    """The backend named by DLQ_INFERENCE."""
    if settings.inference == "simulated":
        return SimulatedBackend(
            success_rate=settings.simulated_success_rate,
            latency_ms=settings.simulated_latency_ms,
            jitter_ms=settings.simulated_jitter_ms,
            seed=settings.simulated_seed,
            default_model=settings.default_model,
            call_log_size=settings.call_log_size,
        )
    if settings.inference == "openai":
        return OpenAIBackend(
            base_url=settings.inference_url,
            api_key=settings.inference_api_key,
            timeout_ms=settings.inference_timeout_ms,
            pool_size=settings.concurrency,
            default_model=settings.default_model,
            call_log_size=settings.call_log_size,
        )
    raise SettingsError(f"DLQ_INFERENCE={settings.inference!r} names no known backend")
