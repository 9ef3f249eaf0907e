import asyncio

import pytest

from dlqapp.core.errors import ErrorClass, InferenceError
from dlqapp.core.requests import validate_request
from dlqapp.inference import SimulatedBackend


def request(request_id="r", **metadata):
    return validate_request({"request_id": request_id, "prompt": "hello", "metadata": metadata})


def test_directive_fails_exactly_the_first_n_attempts_then_succeeds():
    backend = SimulatedBackend(latency_ms=0, jitter_ms=0)
    req = request(simulate={"fail_times": 2, "error": "rate_limited", "retry_after": 3})

    async def run():
        for attempt in (1, 2):
            with pytest.raises(InferenceError) as info:
                await backend.complete(req, attempt)
            assert info.value.failure.error_class is ErrorClass.RATE_LIMITED
            assert info.value.failure.retry_after_ms == 3000
        assert (await backend.complete(req, 3)).text

    asyncio.run(run())
    assert backend.calls_for("r") == 3


def test_seeded_backends_agree_and_success_rate_holds():
    async def outcomes(seed):
        backend = SimulatedBackend(success_rate=0.8, latency_ms=0, jitter_ms=0, seed=seed)
        results = []
        for i in range(2000):
            try:
                await backend.complete(request(f"r{i}"), 1)
                results.append("ok")
            except InferenceError as exc:
                results.append(exc.failure.error_class.value)
        return results

    a, b = asyncio.run(outcomes(42)), asyncio.run(outcomes(42))
    assert a == b
    share = a.count("ok") / len(a)
    assert 0.76 < share < 0.84
    assert {"timeout", "server_error", "rate_limited", "invalid_request"} <= set(a)
