"""Waiting for rate capacity, per model (asyncio; the arithmetic is `TokenBucket`'s).

`RateGate.acquire(model, tokens, slot=...)` returns when the model's requests-per-minute
and tokens-per-minute buckets both have room and a backend slot was granted, and takes
one request and the estimated tokens at that moment, so calls leave exactly at the pace
of the buckets (capacity taken earlier and spent after a wait for a slot would go out in
bursts). `Permit.settle(usage)` corrects the tokens once the response says what was used.

- One turn at a time per model, by priority (a `SlotLimiter(1)`: `high` before `normal`
  before `low`, with its ageing): the holder waits for capacity *without* a backend slot,
  then for a slot. A model out of capacity therefore never holds a slot, and never delays
  calls to another model.
- This worker's share: each bucket refills at limit × `share()`, the fraction of the
  input partitions this worker owns (so N workers that split the partitions split the
  limit). The share is read on every acquire: after a rebalance the new rate applies
  at once, and a bucket never holds more than the new capacity.
- Burst: a bucket holds `burst_s` seconds of its rate (at least one request), so calls
  are paced evenly rather than sent in bursts a provider would count against a window.
  Buckets start empty: a worker that starts or takes over partitions ramps up instead
  of bursting into capacity another worker may just have used.
- A 429's Retry-After pauses the limited model's calls (`pause`, at most `MAX_PAUSE_S`),
  like the provider asked. Models without limits are not paused: one request's 429 with
  a long Retry-After must not stop every call to its model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from dlqapp.flowcontrol.bucket import TokenBucket
from dlqapp.flowcontrol.limits import ANY_MODEL, ModelLimit, RateLimits
from dlqapp.flowcontrol.slots import NORMAL, SlotLimiter

BURST_S = 0.5
MAX_PAUSE_S = 60.0
"""The longest a Retry-After pauses a model (a longer one still parks its own request that long)."""
MAX_SLEEP_S = 0.5
"""Waiters look again at least this often (the share or a pause may have changed)."""


@dataclass
class _ModelGate:
    limit: ModelLimit
    requests: TokenBucket | None
    tokens: TokenBucket | None
    turns: SlotLimiter = field(default_factory=lambda: SlotLimiter(1))
    share: float = 1.0
    paused_until: float = 0.0
    waiting: int = 0
    waited: int = 0
    waited_s: float = 0.0


class Permit:
    """Capacity taken for one call; `settle` corrects the token estimate."""

    def __init__(self, bucket: TokenBucket | None, estimate: int) -> None:
        self._bucket = bucket
        self.estimate = estimate
        self._settled = False

    def settle(self, used: int | None) -> None:
        """The call used `used` tokens (None: unknown, the estimate stands)."""
        if self._settled or self._bucket is None or used is None:
            return
        self._settled = True
        self._bucket.give_back(self.estimate - used)


UNLIMITED = Permit(None, 0)


class RateGate:
    """Per-model waiting for requests-per-minute and tokens-per-minute capacity."""

    def __init__(
        self,
        limits: RateLimits,
        *,
        default_model: str = "",
        share: Callable[[], float] = lambda: 1.0,
        clock: Callable[[], float] = time.monotonic,
        burst_s: float = BURST_S,
        sleep: Callable[[float], Any] = asyncio.sleep,
        on_wait: Callable[[str, float], None] = lambda model, seconds: None,
    ) -> None:
        self.limits = limits
        self.default_model = default_model
        self._share = share
        self._clock = clock
        self._burst_s = burst_s
        self._sleep = sleep
        self._on_wait = on_wait
        self._models: dict[str, _ModelGate] = {}

    @property
    def share(self) -> float:
        """This worker's share of every limit now (owned input partitions / all of them)."""
        return self._share()

    def is_limited(self, model: str | None) -> bool:
        """Whether calls to `model` wait for DLQ_RATE_LIMITS capacity (else only for a backend slot)."""
        return self._gate(self.model_of(model)) is not None

    def model_of(self, model: str | None) -> str:
        """The model a call goes to: the one named, else DLQ_DEFAULT_MODEL."""
        return model or self.default_model

    async def acquire(
        self,
        model: str | None,
        tokens: int,
        *,
        max_wait_s: float | None = None,
        priority: int = NORMAL,
        slot: Callable[[], Awaitable[Any]] | None = None,
    ) -> Permit | None:
        """Wait for room for one call of `tokens` to `model`, then take a backend slot (`slot()`,
        which the caller holds for its call) and the capacity at once. None when `max_wait_s`
        ran out first (the slot may have been taken: the caller gives it back)."""
        model_name = self.model_of(model)
        gate = self._gate(model_name)
        if gate is None:
            if slot is not None:
                await slot()
            return UNLIMITED
        started = self._clock()
        give_up_at = None if max_wait_s is None else started + max_wait_s
        gate.waiting += 1
        try:
            async with gate.turns.slot(priority):
                if not await self._room(gate, tokens, give_up_at):
                    return None
                if slot is not None:
                    await slot()
                    # Rare: a Retry-After, a smaller share or a token correction came while it waited for the slot.
                    if not await self._room(gate, tokens, give_up_at):
                        return None
                return self._take(model_name, gate, tokens, started)
        finally:
            gate.waiting -= 1

    async def _room(self, gate: _ModelGate, tokens: int, give_up_at: float | None) -> bool:
        """Wait until the model has room for the call (True), or until `give_up_at` (False)."""
        while True:
            self._apply_share(gate)
            wait = self._wait_s(gate, tokens)
            if wait <= 0:
                return True
            now = self._clock()
            if give_up_at is not None:
                if now >= give_up_at:
                    return False
                wait = min(wait, give_up_at - now)
            await self._sleep(min(wait, MAX_SLEEP_S))

    def pause(self, model: str | None, seconds: float) -> None:
        """No call to `model` for `seconds` (a provider's Retry-After)."""
        gate = self._gate(self.model_of(model))
        if gate is not None and seconds > 0:
            gate.paused_until = max(gate.paused_until, self._clock() + min(seconds, MAX_PAUSE_S))

    def _gate(self, model: str) -> _ModelGate | None:
        gate = self._models.get(model)
        if gate is None:
            limit = self.limits.for_model(model)
            if limit is None:
                return None
            share = self._share()
            gate = _ModelGate(limit, self._bucket(limit.rpm, share), self._bucket(limit.tpm, share), share=share)
            self._models[model] = gate
        return gate

    def _bucket(self, per_minute: float | None, share: float) -> TokenBucket | None:
        if per_minute is None:
            return None
        rate = per_minute / 60 * share
        return TokenBucket(rate, self._capacity(rate), self._clock)

    def _capacity(self, rate_per_s: float) -> float:
        return max(1.0, rate_per_s * self._burst_s)

    def _apply_share(self, gate: _ModelGate) -> None:
        share = self._share()
        if share == gate.share:
            return
        gate.share = share
        for bucket, per_minute in ((gate.requests, gate.limit.rpm), (gate.tokens, gate.limit.tpm)):
            if bucket is not None and per_minute is not None:
                rate = per_minute / 60 * share
                bucket.set_rate(rate, self._capacity(rate))

    def _wait_s(self, gate: _ModelGate, tokens: int) -> float:
        waits = [gate.paused_until - self._clock()]
        if gate.requests is not None:
            waits.append(gate.requests.wait_s(1))
        if gate.tokens is not None:
            waits.append(gate.tokens.wait_s(tokens))
        return max(waits)

    def _take(self, model: str, gate: _ModelGate, tokens: int, started: float) -> Permit:
        if gate.requests is not None:
            gate.requests.take(1)
        if gate.tokens is not None:
            gate.tokens.take(tokens)
        waited = self._clock() - started
        if waited > 0:
            gate.waited += 1
            gate.waited_s += waited
        self._on_wait(model, waited)
        return Permit(gate.tokens, tokens)

    def snapshot(self) -> dict[str, Any]:
        """Per limited model: this worker's share of its limits, waiters and waits so far."""
        out: dict[str, Any] = {}
        for model, gate in sorted(self._models.items()):
            out[model] = {
                "rpm": gate.limit.rpm * gate.share if gate.limit.rpm else None,
                "tpm": gate.limit.tpm * gate.share if gate.limit.tpm else None,
                "share": round(gate.share, 4),
                "waiting": gate.waiting,
                "waited_calls": gate.waited,
                "waited_s": round(gate.waited_s, 3),
                "paused_for_s": round(max(0.0, gate.paused_until - self._clock()), 3),
            }
        return out


def metric_label(limits: RateLimits, model: str) -> str:
    """A bounded metric label: the model when DLQ_RATE_LIMITS names it, else `*`."""
    return model if model in limits.by_model else ANY_MODEL
