"""The retries view: parked retries of this worker, filtered and paged, and merged across workers.

Each worker walks the parked-retries table of the partitions it owns (`local_retries`);
the web layer fans `GET /retries/` out to every worker and merges (`merge_retries`).
The walk is exact (the total is a count, not an estimate) and yields to the event loop
between chunks (`ParkedRetries.walk`).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dlqapp.core.envelope import Envelope
from dlqapp.deadletters.queries import BadQuery
from dlqapp.retries.keys import decode_parked_key
from dlqapp.retries.parked import ParkedRetries

MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class RetryFilter:
    """Which parked retries a list refers to: a tier label and/or an error class."""

    tier: str | None = None
    error_class: str | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> RetryFilter:
        tier, error_class = params.get("tier"), params.get("error_class")
        for name, value in (("tier", tier), ("error_class", error_class)):
            if value is not None and not isinstance(value, str):
                raise BadQuery(f"{name} must be a string")
        return cls(tier or None, error_class or None)

    def to_params(self) -> dict[str, str]:
        return {k: v for k, v in (("tier", self.tier), ("error_class", self.error_class)) if v}


def item_of(key: bytes, envelope: Envelope, *, tier_label: str, firing: bool) -> dict[str, Any]:
    """One row of the retries view."""
    due_ms, request_id = decode_parked_key(key)
    return {
        "request_id": request_id,
        "tier": tier_label,
        "attempt": envelope.attempts + 1,
        "due_at": due_ms,
        "error_class": envelope.error_class,
        "last_error": (envelope.last_error or "")[:MAX_ERROR_CHARS],
        "firing": firing,
    }


async def local_retries(parked: ParkedRetries, firing: Any, *, flt: RetryFilter, top: int) -> dict[str, Any]:
    """This worker's matches: exact total, the `top` earliest due, counts by tier and class.

    `by_tier` counts what matches the class filter (what choosing a tier would show),
    `by_error_class` what matches the tier filter. `firing(key, request_id)` tells whether
    the timer or an operator already handed the entry to the due agent.
    """
    if flt.tier is None and flt.error_class is None:
        return await _unfiltered(parked, firing, top)
    total = 0
    by_tier: Counter[str] = Counter()
    by_class: Counter[str] = Counter()
    heap: list[tuple[int, int, dict[str, Any]]] = []
    seq = 0
    async for key, value in parked.walk(values=True):
        try:
            envelope = Envelope.from_bytes(value or b"")
        except (ValueError, KeyError):
            continue  # not a parked envelope
        tier = parked.tier_of(envelope).label
        error_class = envelope.error_class or "unknown"
        class_ok = flt.error_class is None or error_class == flt.error_class
        tier_ok = flt.tier is None or tier == flt.tier
        if class_ok:
            by_tier[tier] += 1
        if tier_ok:
            by_class[error_class] += 1
        if not (class_ok and tier_ok):
            continue
        total += 1
        due_ms, request_id = decode_parked_key(key)
        seq += 1
        entry = (-due_ms, -seq, item_of(key, envelope, tier_label=tier, firing=firing(key, request_id)))
        if len(heap) < top:
            heapq.heappush(heap, entry)
        elif top and entry > heap[0]:
            heapq.heapreplace(heap, entry)
    items = [item for _, _, item in sorted(heap, reverse=True)]
    return {"total": total, "items": items, "by_tier": dict(by_tier), "by_error_class": dict(by_class)}


async def _unfiltered(parked: ParkedRetries, firing: Any, top: int) -> dict[str, Any]:
    """No filter: count keys only (no envelope is decoded but the `top` shown); per-tier counts
    come from the running per-tier gauge (`ParkedRetries.by_tier`)."""
    total = 0
    order: list[tuple[int, str, bytes]] = []
    async for key, _ in parked.walk(values=False):
        total += 1
        due_ms, request_id = decode_parked_key(key)
        order.append((due_ms, request_id, key))
        if len(order) > 4 * max(top, 1) + 1024:
            order = heapq.nsmallest(top, order)
    items = []
    for _, request_id, key in heapq.nsmallest(top, order):
        envelope = parked.get(key)
        if envelope is not None:
            items.append(
                item_of(key, envelope, tier_label=parked.tier_of(envelope).label, firing=firing(key, request_id))
            )
    return {
        "total": total,
        "items": items,
        "by_tier": {k: v for k, v in parked.by_tier_label().items() if v},
        "by_error_class": {},
    }


def merge_retries(pages: Iterable[Mapping[str, Any]], limit: int, offset: int) -> dict[str, Any]:
    """One page, earliest due first, from every worker's local answer."""
    pages = list(pages)
    items = sorted((i for p in pages for i in p["items"]), key=lambda i: (i["due_at"], i["request_id"]))
    by_tier: Counter[str] = Counter()
    by_class: Counter[str] = Counter()
    for page in pages:
        by_tier.update(page.get("by_tier", {}))
        by_class.update(page.get("by_error_class", {}))
    return {
        "total": sum(p["total"] for p in pages),
        "items": items[offset : offset + limit],
        "by_tier": dict(by_tier),
        "by_error_class": dict(by_class),
    }
