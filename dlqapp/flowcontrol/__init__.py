"""Flow control: stay under a provider's limits instead of bouncing off them.

- `limits`: `DLQ_RATE_LIMITS` parsed into per-model requests/tokens per minute.
- `bucket`: a token bucket on an injected clock (pure).
- `estimate`: a request's tokens, estimated before the call.
- `aimd`: the adaptive concurrency limit (additive increase, multiplicative decrease).
- `gate`: per-model waiting for rate capacity (asyncio).
- `slots`: backend slots by priority, under the adaptive limit (asyncio).
"""
