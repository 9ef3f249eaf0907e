"""Retry tiers as values: built once from the settings, used everywhere by name."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tier:
    """One retry tier: its place in the chain, its delay and its topic."""

    index: int
    """0-based: tier 0 holds the retry after the first failed attempt."""
    delay_ms: int
    topic: str
    """The full topic name (with DLQ_TOPIC_PREFIX)."""
    label: str
    """The topic name without the prefix (`retry-1s`): what metrics and the API show."""

    @property
    def attempt(self) -> int:
        """The attempt number a retry from this tier makes (2 for tier 0)."""
        return self.index + 2


def build_tiers(delays_ms: tuple[int, ...], topics: tuple[str, ...], prefix: str) -> tuple[Tier, ...]:
    """The tiers for `delays_ms`, published on `topics` (same order)."""
    return tuple(
        Tier(index, delay, topic, topic[len(prefix) :] if prefix and topic.startswith(prefix) else topic)
        for index, (delay, topic) in enumerate(zip(delays_ms, topics, strict=True))
    )


def tier_after(attempts: int, tiers: tuple[Tier, ...]) -> Tier:
    """The tier a request waits in after `attempts` failed attempts (clamped to the chain)."""
    return tiers[max(0, min(attempts - 1, len(tiers) - 1))]
