"""Replays asked over HTTP: one request's (optionally edited), and bulk replays by keys or
by filter, run at once, paced as a job, or only estimated (a dry run)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from dlqapp.api.cluster import Cluster
from dlqapp.api.http import ApiError, force_of
from dlqapp.core.commands import Action, Command, check_edit
from dlqapp.core.prices import PriceTable, nusd_of, usd
from dlqapp.core.usage import Usage
from dlqapp.deadletters.entries import DeadLetterEntry, find_dead_letter, owner_id
from dlqapp.deadletters.estimate import METHOD as ESTIMATE_METHOD
from dlqapp.deadletters.estimate import estimated_tokens, replay_tokens
from dlqapp.deadletters.queries import DlqFilter, newest_first
from dlqapp.deadletters.replay_jobs import ReplayJobs
from dlqapp.kafka.faust_tables import active_partitions, values_newest_first
from dlqapp.tables.topology import Topology

DRY_RUN_SAMPLE = 10
ESTIMATE_KEYS_MAX = 200
"""A dry run of a replay by keys estimates tokens over at most this many of them (scaled)."""
FILTER_FIELDS = ("error_class", "model", "since", "until", "q")
MONEY_FIELDS = (
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "nusd",
    "spent_nusd",
    "from_recorded_usage",
    "from_estimate",
    "unpriced",
)


def money_of(parts: list[dict[str, Any]], scale: float) -> dict[str, Any]:
    """The money of a dry run from every worker's share: tokens and US dollars of one replay of
    each dead letter, how many figures come from recorded usage and how many from the estimate,
    and what the dead letters cost so far."""
    total = dict.fromkeys(MONEY_FIELDS, 0)
    for part in parts:
        for name, value in (part.get("money") or {}).items():
            if name in total:
                total[name] += value
    scaled = {k: round(v * scale) for k, v in total.items()}
    return {
        "tokens": {
            "prompt": scaled["prompt_tokens"],
            "completion": scaled["completion_tokens"],
            "cached": scaled["cached_tokens"],
        },
        "cost_usd": usd(scaled["nusd"]),
        "from_recorded_usage": scaled["from_recorded_usage"],
        "from_estimate": scaled["from_estimate"],
        "unpriced": scaled["unpriced"],
        "spent_so_far_usd": usd(scaled["spent_nusd"]),
        "method": (
            "per dead letter, the tokens its provider reported for its last answered attempt where there is one "
            "(from_recorded_usage), else prompt characters / 4 + 4 a message and the completion budget "
            "(from_estimate); priced with DLQ_PRICES (unpriced: models without a price, counted in tokens only)"
        ),
    }


class Replays:
    """Replays on the workers owning the dead letters (commands through `Cluster.ask`)."""

    def __init__(
        self,
        cluster: Cluster,
        topology: Topology,
        *,
        partitions: int,
        jobs: ReplayJobs,
        list_dead_letters: Any,
        prices: PriceTable | None = None,
        default_model: str = "",
    ) -> None:
        self.cluster = cluster
        self.topology = topology
        self.partitions = partitions
        self.jobs = jobs
        self.list_dead_letters = list_dead_letters
        self.prices = prices or PriceTable({})
        self.default_model = default_model

    async def bulk_keys(self, body: Any) -> tuple[list[str], float | None]:
        if not isinstance(body, dict):
            raise ApiError(400, 'body must be {"keys": [...]} or {"all": true, ...filters}')
        rate = body.get("rate")
        if rate is not None and (not isinstance(rate, (int, float)) or isinstance(rate, bool) or rate <= 0):
            raise ApiError(400, "rate must be a positive number of replays per second")
        if "keys" in body:
            keys = body["keys"]
            if not isinstance(keys, list) or not keys or not all(isinstance(k, str) and k for k in keys):
                raise ApiError(400, "keys must be a non-empty list of request ids")
            return list(dict.fromkeys(keys)), rate
        if body.get("all") is True:
            flt = DlqFilter.from_params({k: v for k, v in body.items() if k in FILTER_FIELDS})
            page = await self.list_dead_letters(flt, limit=10**9, offset=0)
            return [item.get("key") or item["request_id"] for item in page["items"]], rate
        raise ApiError(400, 'body must name "keys" (a list) or "all": true')

    async def bulk_replay(self, body: Any, actor: str) -> tuple[dict[str, Any], int]:
        keys, rate = await self.bulk_keys(body)
        force = force_of(body)
        dry_run, background = body.get("dry_run", False), body.get("background", False)
        if not isinstance(dry_run, bool) or not isinstance(background, bool):
            raise ApiError(400, "dry_run and background must be true or false")
        if dry_run:
            return await self.dry_run(body, keys), 200
        jobs = self.jobs

        def replay(rid: str) -> Awaitable[dict[str, Any]]:
            return self.cluster.ask(Command(Action.REPLAY, rid, actor, force=force))

        if rate or background:  # answered at once; the replays' progress at status_url
            job = jobs.start(keys, rate or None, replay)
            return {"replay_id": job.id, "total": len(keys), "rate": rate, "status_url": f"/dlq/replays/{job.id}/"}, 202
        return await jobs.run_now(keys, replay), 200

    async def dry_run(self, body: dict[str, Any], keys: list[str]) -> dict[str, Any]:
        """What a bulk replay would send: exact count, sample ids, estimated prompt tokens."""
        answer: dict[str, Any] = {
            "dry_run": True,
            "total": len(keys),
            "sample": keys[:DRY_RUN_SAMPLE],
            "estimate": ESTIMATE_METHOD,
        }
        if "keys" in body:
            sampled = keys[:ESTIMATE_KEYS_MAX]
            components, errors = await self.cluster.fan_out(
                lambda: self.local_estimate(sampled, None), "/dlq/_local_estimate/", [("key", k) for k in sampled]
            )
            counted = sum(p["entries"] for p in components)
            tokens = sum(p["tokens"] for p in components)
            scale = len(keys) / counted if len(keys) > len(sampled) and counted else 1.0
            if scale != 1.0:
                tokens = round(tokens * scale)
                answer["estimate"] += f", scaled from the first {len(sampled)} keys"
        else:
            flt = DlqFilter.from_params({k: v for k, v in body.items() if k in FILTER_FIELDS})
            components, errors = await self.cluster.fan_out(
                lambda: self.local_estimate(None, flt), "/dlq/_local_estimate/", flt.to_params()
            )
            tokens = sum(p["tokens"] for p in components)
            scale = 1.0
        answer["estimated_prompt_tokens"] = tokens
        answer["money"] = money_of(components, scale)
        if errors:
            answer["incomplete"] = errors
        return answer

    def local_estimate(self, keys: list[str] | None, flt: DlqFilter | None) -> dict[str, Any]:
        """Estimated prompt tokens of this worker's dead letters among `keys`, or matching `flt`."""
        table = self.topology.dead_letters
        if keys is None:
            index = self.topology.dead_letters_by_time
            walks = [values_newest_first(index, partition) for partition in active_partitions(index)]
            keys = [
                item.get("key") or item["request_id"]
                for item in newest_first(walks)
                if flt is None or flt.matches(item)
            ]
        tokens = entries = 0
        money: dict[str, int] = dict.fromkeys(MONEY_FIELDS, 0)
        for key in keys:
            found = find_dead_letter(table, key, self.partitions)
            if found is not None:
                entry = DeadLetterEntry.decode(table[found])
                tokens += estimated_tokens(entry.payload_text, entry.payload_bytes)
                entries += 1
                self._add_replay_cost(money, entry)
        return {"tokens": tokens, "entries": entries, "money": money}

    def _add_replay_cost(self, money: dict[str, int], entry: DeadLetterEntry) -> None:
        """One replay's tokens and cost (nano-dollars), and what was spent on it so far."""
        replay = replay_tokens(entry.history, entry.payload_text, entry.payload_bytes)
        money["prompt_tokens"] += replay.prompt
        money["completion_tokens"] += replay.completion
        money["cached_tokens"] += replay.cached
        money["from_recorded_usage" if replay.recorded else "from_estimate"] += 1
        usage = Usage(replay.prompt, replay.completion, replay.cached, estimated=not replay.recorded)
        cost = self.prices.cost_nusd(entry.model or self.default_model, usage)
        if cost is None:
            money["unpriced"] += 1
        else:
            money["nusd"] += cost
        money["spent_nusd"] += nusd_of(entry.cost_usd or 0)

    async def replay(self, request_id: str, body: Any, actor: str) -> dict[str, Any]:
        payload, force = None, False
        if body is not None:
            if not isinstance(body, dict) or set(body) - {"payload", "force"}:
                raise ApiError(400, 'body must be empty or {"payload": {...}, "force": true|false}')
            payload = body.get("payload")
            force = force_of(body)
        if payload is not None:
            problems = check_edit(owner_id(request_id), payload)
            if problems:
                raise ApiError(400, "edited payload is not a valid request", reasons=problems)
        return await self.cluster.ask(Command(Action.REPLAY, request_id, actor, payload, force))
