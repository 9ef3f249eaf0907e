"""Read models over the tables: DLQ listing with filters, and the stats.

Each worker answers for the partitions it actively owns (`local_*`); the web layer
fans a request out to every worker and merges the answers (`merge_*`), so a read on
any worker sees the whole DLQ. Counts are derived from per-request entries, never
from running counters, so a crash and replay cannot double-count.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dlqapp.core import compact_json
from dlqapp.core.prices import usd
from dlqapp.tables.counters import grouped


class BadQuery(ValueError):
    """A query parameter has the wrong type or value."""


def _int_param(params: Mapping[str, str | None], name: str, default: int | None, minimum: int = 0) -> int | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadQuery(f"{name} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise BadQuery(f"{name} must be >= {minimum}")
    return value


@dataclass(frozen=True)
class DlqFilter:
    """Which dead letters a list, a bulk replay or a count refers to."""

    error_class: str | None = None
    model: str | None = None
    since: int | None = None
    until: int | None = None
    text: str | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> DlqFilter:
        """From query parameters or a JSON body (`error_class`, `model`, `since`, `until`, `q`)."""
        as_str = {k: (str(v) if v is not None else None) for k, v in params.items()}
        return cls(
            error_class=as_str.get("error_class") or None,
            model=as_str.get("model") or None,
            since=_int_param(as_str, "since", None),
            until=_int_param(as_str, "until", None),
            text=(as_str.get("q") or None),
        )

    @property
    def counted_by_class(self) -> bool:
        """True when the running counters know how many entries match (no filter but the class)."""
        return not (self.model or self.since is not None or self.until is not None or self.text)

    def to_params(self) -> dict[str, str]:
        values = {
            "error_class": self.error_class,
            "model": self.model,
            "since": self.since,
            "until": self.until,
            "q": self.text,
        }
        return {k: str(v) for k, v in values.items() if v is not None}

    def matches(self, entry: Mapping[str, Any]) -> bool:
        if self.error_class and entry.get("error_class") != self.error_class:
            return False
        if self.model and entry.get("model") != self.model:
            return False
        dead_at = entry.get("dead_at") or 0
        if self.since is not None and dead_at < self.since:
            return False
        if self.until is not None and dead_at > self.until:
            return False
        if self.text:
            haystack = " ".join(str(entry.get(k) or "") for k in ("final_error", "last_error", "request_id")).lower()
            if self.text.lower() not in haystack:
                return False
        return True


def page_params(params: Mapping[str, str]) -> tuple[int, int]:
    """(limit, offset) from query parameters; limit defaults to 50, at most 1000."""
    limit = _int_param(params, "limit", 50, minimum=1)
    offset = _int_param(params, "offset", 0)
    return min(limit or 50, 1000), offset or 0


def local_page(
    summaries_newest_first: Iterable[dict[str, Any]], flt: DlqFilter, *, top: int, by_class: Mapping[str, int]
) -> dict[str, Any]:
    """Matching entries of this worker: total, newest `top` summaries, counts by class.

    With no filter but the error class, the total and counts come from the running
    counters (`by_class`) and only the first `top` matches are read; other filters
    walk the summaries to count what matches.
    """
    items: list[dict[str, Any]] = []
    if flt.counted_by_class:
        counts = (
            {flt.error_class: by_class.get(flt.error_class, 0)}
            if flt.error_class
            else {k: v for k, v in by_class.items() if v > 0}
        )
        for item in summaries_newest_first:
            if len(items) >= top:
                break
            if flt.matches(item):
                items.append(item)
        return {"total": sum(counts.values()), "items": items, "counts": counts}
    total = 0
    counted: Counter[str] = Counter()
    for item in summaries_newest_first:
        if flt.matches(item):
            total += 1
            counted[item["error_class"]] += 1
            if len(items) < top:
                items.append(item)
    return {"total": total, "items": items, "counts": dict(counted)}


def newest_first(walks: Iterable[Iterable[bytes]]) -> Iterator[dict[str, Any]]:
    """Summaries from several partitions' time indexes (each newest first), merged newest first."""
    decoded = [(compact_json.loads(blob) for blob in walk) for walk in walks]
    return heapq.merge(
        *decoded, key=lambda item: (item.get("dead_at") or 0, item.get("key") or item["request_id"]), reverse=True
    )


def merge_pages(pages: Iterable[Mapping[str, Any]], limit: int, offset: int) -> dict[str, Any]:
    """One page, newest first, from every worker's local page."""
    pages = list(pages)
    items = sorted(
        (i for p in pages for i in p["items"]),
        key=lambda i: (i.get("dead_at") or 0, i.get("key") or i["request_id"]),
        reverse=True,
    )
    counts: Counter[str] = Counter()
    for page in pages:
        counts.update(page.get("counts", {}))
    return {"total": sum(p["total"] for p in pages), "items": items[offset : offset + limit], "counts": dict(counts)}


def local_stats(total: Counter[str], oldest_dead_at: int | None) -> dict[str, Any]:
    """This worker's share of the counts, from its running counters (dlqapp.tables.counters)."""
    return {
        "received": total["received"],
        "succeeded": total["succeeded"],
        "retried": grouped(total, "retried"),
        "dead_lettered": grouped(total, "dead_lettered"),
        "duplicates_skipped": total["duplicates_skipped"],
        "reprocessed": total["reprocessed"],
        "dlq_size": max(0, total["dlq_size"]),
        "dlq_by_error_class": grouped(total, "dlq_class"),
        "dlq_by_model": grouped(total, "dlq_model"),
        "oldest_dead_at": oldest_dead_at,
        "budget_held": max(0, total["budget_held_now"]),
        "money": {
            "cost_nusd": total["cost_nusd"],
            "tokens": {kind: total[f"tokens|{kind}"] for kind in ("prompt", "completion", "cached")},
            "estimated_prompt_tokens": total["tokens_estimated"],
            "unpriced_attempts": total["unpriced_attempts"],
            "failed_nusd_by_class": grouped(total, "cost_failed"),
        },
    }


def merge_money(parts: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Money across workers: tokens, cost, and the cost of requests that still failed by class (USD)."""
    tokens: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    cost = estimated = unpriced = 0
    for part in parts:
        tokens.update(part.get("tokens") or {})
        failed.update(part.get("failed_nusd_by_class") or {})
        cost += part.get("cost_nusd", 0)
        estimated += part.get("estimated_prompt_tokens", 0)
        unpriced += part.get("unpriced_attempts", 0)
    return {
        "cost_usd": usd(cost),
        "tokens": {kind: tokens[kind] for kind in ("prompt", "completion", "cached")},
        "estimated_prompt_tokens": estimated,
        "unpriced_attempts": unpriced,
        "failed_cost_usd": usd(sum(v for v in failed.values() if v > 0)),
        "failed_cost_usd_by_class": {k: usd(v) for k, v in sorted(failed.items()) if v > 0},
    }


def merge_stats(parts: Iterable[Mapping[str, Any]], now: int) -> dict[str, Any]:
    """Cluster-wide stats from every worker's share."""
    parts = list(parts)
    merged: dict[str, Any] = {"received": 0, "succeeded": 0, "duplicates_skipped": 0, "reprocessed": 0, "dlq_size": 0}
    counters: dict[str, Counter[str]] = {
        k: Counter() for k in ("retried", "dead_lettered", "dlq_by_error_class", "dlq_by_model")
    }
    oldest = None
    breakers: dict[str, Any] = {}
    flows: dict[str, Any] = {}
    for part in parts:
        breakers.update(part.get("breaker", {}))
        flows.update(part.get("flow", {}))
        for key in merged:
            merged[key] += part[key]
        for key, counter in counters.items():
            counter.update(part[key])
        if part["oldest_dead_at"] is not None:
            oldest = part["oldest_dead_at"] if oldest is None else min(oldest, part["oldest_dead_at"])
    merged.update({k: dict(v) for k, v in counters.items()})
    merged["oldest_entry_age_ms"] = (now - oldest) if oldest is not None else None
    merged["budget_held"] = sum(part.get("budget_held", 0) for part in parts)
    merged["money"] = merge_money([part.get("money") or {} for part in parts])
    merged["breaker"] = breakers
    merged["flow"] = flows
    return merged
