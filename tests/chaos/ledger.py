"""The ledger check: every request id's final outcome, read back from `results` and `dlq`."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dlqapp.settings import SETTINGS
from tests.kafka_io import Record, all_keys_seen, read_topic, read_until_quiet
from tests.support import Worker, http_json

FULL = os.environ.get("CHAOS_FULL") == "1"
"""`make chaos` sets CHAOS_FULL=1 for the full-size runs; `make test` runs the reduced ones."""


def under_exactly_once(env: dict[str, str] | None = None) -> bool:
    """Whether workers started with `env` (default: this process's, which they inherit) run
    under DLQ_PROCESSING_GUARANTEE=exactly_once, the setting's default included."""
    default = next(value for name, value, _ in SETTINGS if name == "DLQ_PROCESSING_GUARANTEE")
    return dict(os.environ if env is None else env).get("DLQ_PROCESSING_GUARANTEE", default) == "exactly_once"


@dataclass
class Ledger:
    """What happened to each of a run's request ids."""

    ids: list[str]
    results: Counter[str] = field(default_factory=Counter)
    dead: Counter[str] = field(default_factory=Counter)
    attempts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def read(
        cls,
        bootstrap: str,
        results_topic: str,
        dlq_topic: str,
        ids: list[str],
        timeout: float,
        partitions: int = 3,
        client: dict[str, Any] | None = None,
    ) -> Ledger:
        """Read both topics until every id has an outcome (or fail after `timeout`)."""
        wanted = set(ids)
        records = read_topic(bootstrap, [results_topic, dlq_topic], all_keys_seen(wanted), timeout, partitions, client)
        return cls.of(records, results_topic, ids)

    @classmethod
    def read_settled(
        cls,
        bootstrap: str,
        results_topic: str,
        dlq_topic: str,
        ids: list[str],
        timeout: float,
        partitions: int = 3,
        client: dict[str, Any] | None = None,
    ) -> Ledger:
        """`read` until every id has an outcome, then `read_to_end`: late duplicates counted too."""
        cls.read(bootstrap, results_topic, dlq_topic, ids, timeout, partitions, client)
        return cls.read_to_end(bootstrap, results_topic, dlq_topic, ids, partitions, client)

    @classmethod
    def read_to_end(
        cls,
        bootstrap: str,
        results_topic: str,
        dlq_topic: str,
        ids: list[str],
        partitions: int = 3,
        client: dict[str, Any] | None = None,
        quiet_s: float = 3.0,
    ) -> Ledger:
        """Read both topics to their end once their end offsets stayed put for `quiet_s`
        (the workers have nothing left to write or commit): every outcome, duplicates included."""
        records = read_until_quiet(bootstrap, [results_topic, dlq_topic], partitions, client, quiet_s)
        return cls.of(records, results_topic, ids)

    @classmethod
    def of(cls, records: list[Record], results_topic: str, ids: list[str]) -> Ledger:
        wanted = set(ids)
        ledger = cls(ids)
        for record in records:
            if record.key is None or not record.value:
                continue
            rid = record.key.decode()
            if rid not in wanted:
                continue
            if record.topic == results_topic:
                ledger.results[rid] += 1
                ledger.attempts[rid] = max(ledger.attempts.get(rid, 0), record.json["attempts"])
            else:
                ledger.dead[rid] += 1
                ledger.attempts[rid] = max(ledger.attempts.get(rid, 0), int(record.headers.get("attempts", "0")))
        return ledger

    @property
    def lost(self) -> list[str]:
        return [rid for rid in self.ids if rid not in self.results and rid not in self.dead]

    @property
    def duplicate_outcomes(self) -> int:
        """Outcome records beyond one per id (at-least-once redeliveries after a crash)."""
        return sum(self.results.values()) + sum(self.dead.values()) - len(set(self.results) | set(self.dead))

    @property
    def mixed(self) -> list[str]:
        return [rid for rid in self.ids if rid in self.results and rid in self.dead]

    def extra_calls(self, mock_url: str) -> int:
        """Backend calls beyond the attempts the outcomes record."""
        calls = http_json(mock_url + "/_mock/calls", timeout=60)[1]
        return sum(calls.get(rid, 0) for rid in self.ids) - sum(self.attempts.get(rid, 0) for rid in self.ids)

    def summary(self, mock_url: str | None = None) -> dict[str, Any]:
        report = {
            "requests": len(self.ids),
            "results": len(self.results),
            "dead_letters": len(self.dead),
            "lost": len(self.lost),
            "duplicate_outcomes": self.duplicate_outcomes,
            "mixed_outcomes": len(self.mixed),
        }
        if self.mixed:
            report["mixed_sample"] = self.mixed[:5]  # ids to look up in the workers' logs
        if mock_url:
            report["extra_calls"] = self.extra_calls(mock_url)
        return report


def settled_ledger(worker: Worker, ids: list[str], timeout: float = 600) -> Ledger:
    """The ledger of `worker`'s topics as a read_committed consumer sees it once every id has
    an outcome and the topics went quiet (late duplicates counted)."""
    return Ledger.read_settled(worker.bootstrap, worker.topic("results"), worker.topic("dlq"), ids, timeout)


def assert_guarantee(ledger: Ledger, summary: dict[str, Any], env: dict[str, str] | None = None) -> None:
    """Nothing lost; under exactly_once also no duplicate outcome and no id with both."""
    assert ledger.lost == [], f"{len(ledger.lost)} lost, e.g. {ledger.lost[:5]}; {summary}"
    if under_exactly_once(env):
        assert ledger.duplicate_outcomes == 0, summary
        assert ledger.mixed == [], f"ids with both a result and a dead letter: {ledger.mixed[:5]}; {summary}"
