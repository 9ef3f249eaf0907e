"""Histories: what producers, operators and faults do to a deployment, in order and in time.

A `History` is a list of timed `Event`s drawn from `random.Random(seed)` (`generate`) or
written by hand (`NAMED`: the three cases of issue #39 and those the checker found). It is plain data: it prints as
one line an event (`describe`), and it goes to and from JSON (`to_json`, `from_json`), so
a failing one can be shown, saved and run again exactly (tests/history/run.py plays it,
tests/history/check.py judges what came out).

Event kinds and their arguments (`at`: seconds after the history starts):

producer
- `request` `{id, plan, keyed, skew_ms, partition, prompt_chars}`: a valid request; `plan`
  (`{fail_times, status, retry_after}` or null) is posted to the mock's `/_mock/plan` first.
- `duplicate` `{id, after, keyed, skew_ms}`: the same bytes as `id`'s request, sent again
  once the request is `after` (`sent`, `parked`, `succeeded`, `dead_lettered`).
- `invalid_copy` `{id, form, after, keyed}`: an invalid record under a live id:
  `{"request_id": id}` (form `no_messages`) or non-JSON bytes keyed by the id (`non_json`).
- `near_limit` `{id, form, size, partition}`: one record of `size` bytes, just under the
  broker's message limit: non-JSON bytes, or a JSON request with a huge prompt.
- `oversize` `{id, size}`: a valid-looking request over DLQ_MAX_PAYLOAD_BYTES.
- `null` `{key, partition}`: a record with a null value (a tombstone on `input`; Kafka
  wants a key then).
- `burst` `{prefix, count, form}`: `count` invalid records (`{"request_id": ...}` without
  messages) sent at full speed.
- `flood` `{prefix, count, tenant}`: `count` valid requests of one tenant, keyed by their
  ids, sent at full speed (with the tail read: the others' requests written behind it run
  ahead of their turn).

operator (`via`: `http` or `cli`)
- `replay` `{id, via, payload, force}`: replay `id`'s dead letter (edited when `payload`),
  once `GET /dlq/{id}/` finds one.
- `replay_all` `{via, error_class, wait_for}`: replay every dead letter (of one class),
  once each id of `wait_for` has a dead letter.
- `discard` `{id, via}`, `run_now` `{id, via}`, `dead_letter_now` `{id, via}`: once `id`
  has a dead letter (discard) or a parked retry (the other two).
- `budget_hold` `{tenant, pair}`: `POST /budgets/` gives `tenant` a day budget it has
  already spent (its requests are held from then on); `budget_release` `{tenant, pair}`:
  no limit again (the held requests go on). Each hold has its release, later; in such a
  history every request names a `tenant` (`metadata.tenant`) and the workers price calls.

faults
- `kill` `{worker, when_stats}` (kill -9, then started again), `sigterm` `{worker,
  when_stats}` (timed until it exits, then started again); with `when_stats` (e.g.
  `{"dlq_size": 400}`), not before `GET /dlq/stats/` shows those counts; `join` (a
  second worker starts), `leave` (it gets SIGTERM and stays down), `broker_restart`,
  `slow_broker` `{delay_ms, for_s}` (every client's traffic to the broker delayed, both
  ways).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any

PRODUCER_KINDS = ("request", "duplicate", "invalid_copy", "near_limit", "oversize", "null", "burst", "flood")
BUDGET_KINDS = ("budget_hold", "budget_release")
OPERATOR_KINDS = ("replay", "replay_all", "discard", "run_now", "dead_letter_now", *BUDGET_KINDS)
FAULT_KINDS = ("kill", "sigterm", "join", "leave", "broker_restart", "slow_broker")

MAX_MESSAGE_BYTES = 1_048_576
"""DLQ_MAX_MESSAGE_BYTES of the histories' workers (and so the topics' max.message.bytes)."""
MAX_PAYLOAD_BYTES = 65_536
"""DLQ_MAX_PAYLOAD_BYTES of the histories' workers: a larger request is invalid."""

BASE_SETTINGS = {
    "DLQ_RETRY_DELAYS": "1s,2s,3s",
    "DLQ_MAX_MESSAGE_BYTES": str(MAX_MESSAGE_BYTES),
    "DLQ_MAX_PAYLOAD_BYTES": str(MAX_PAYLOAD_BYTES),
}
"""Worker settings every history starts from (a history's `settings` add to them)."""

TENANTS = ("t1", "t2")
PRICES = '{"*": {"input": 1.0, "output": 1.0}}'
"""DLQ_PRICES of a history with budgets: any model at $1 per million tokens."""
HOLD_USD = 1e-9
"""A day budget every tenant has spent after its first call."""


@dataclass
class Event:
    at: float
    kind: str
    args: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        args = " ".join(f"{k}={_short(v)}" for k, v in self.args.items() if v not in (None, False, {}))
        return f"{self.at:6.2f}s {self.kind:<15} {args}".rstrip()

    @property
    def target(self) -> str | None:
        """The request id this event is about (None for the others)."""
        return self.args.get("id")


@dataclass
class History:
    seed: int | None
    name: str
    events: list[Event]
    settings: dict[str, str] = field(default_factory=dict)
    """Worker settings on top of BASE_SETTINGS (e.g. longer tiers for one case)."""
    settle_s: float = 60.0
    """How long, at most, the runner waits for the requests to settle after the last event."""

    # -- shape -----------------------------------------------------------------------

    @property
    def worker_settings(self) -> dict[str, str]:
        return {**BASE_SETTINGS, **self.settings}

    @property
    def needs_second_worker(self) -> bool:
        return any(e.kind == "join" for e in self.events)

    @property
    def duration_s(self) -> float:
        return max((e.at for e in self.events), default=0.0)

    def counts(self) -> dict[str, int]:
        """How many events of each family (for reports)."""
        families = {"producer": PRODUCER_KINDS, "operator": OPERATOR_KINDS, "fault": FAULT_KINDS}
        return {name: sum(1 for e in self.events if e.kind in kinds) for name, kinds in families.items()}

    def describe(self) -> str:
        head = f"history {self.name!r} (seed {self.seed}, {len(self.events)} events, settings {self.settings or '{}'})"
        return "\n".join([head, *(f"  [{i:3d}] {e.describe()}" for i, e in enumerate(self.events))])

    # -- shrinking -------------------------------------------------------------------

    def without(self, drop: set[int]) -> History:
        """This history less the events at `drop`, and less every event about a request whose
        `request` event goes (its duplicates, copies and operator actions), and `leave` when
        its `join` goes; a budget's release stays while its hold does."""
        gone_ids = {self.events[i].target for i in drop if self.events[i].kind == "request"}
        join_gone = any(self.events[i].kind == "join" for i in drop)
        holds = {_pair(e) for i, e in enumerate(self.events) if e.kind == "budget_hold" and i not in drop}
        kept = []
        for i, event in enumerate(self.events):
            if event.kind == "budget_release" and _pair(event) in holds:
                kept.append(event)
                continue
            if i in drop or (event.target in gone_ids and event.target is not None):
                continue
            if join_gone and event.kind == "leave":
                continue
            if event.kind == "replay_all" and event.args.get("wait_for"):
                event = Event(
                    event.at,
                    event.kind,
                    {**event.args, "wait_for": [x for x in event.args["wait_for"] if x not in gone_ids]},
                )
            kept.append(event)
        # the same gaps between the events that remain, from 0 s (a shorter run)
        shift = min((e.at for e in kept), default=0.0)
        kept = [Event(round(e.at - shift, 2), e.kind, e.args) for e in kept]
        name = self.name if self.name.endswith(" (shrunk)") else f"{self.name} (shrunk)"
        return History(self.seed, name, kept, dict(self.settings), self.settle_s)

    # -- JSON ------------------------------------------------------------------------

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> History:
        data = json.loads(text)
        events = [Event(e["at"], e["kind"], e.get("args") or {}) for e in data["events"]]
        return cls(
            data.get("seed"),
            data.get("name", "replayed"),
            events,
            data.get("settings") or {},
            data.get("settle_s", 60.0),
        )


def _pair(event: Event) -> tuple[str, int]:
    return (event.args["tenant"], event.args["pair"])


def _short(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":")) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


# -- random histories ------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """How big a random history is: (least, most) of each."""

    requests: tuple[int, int]
    operator: tuple[int, int]
    faults: tuple[int, int]
    produce_s: tuple[float, float]
    """Seconds over which the requests are sent."""


SIZES = {
    "small": Shape(requests=(15, 30), operator=(1, 3), faults=(0, 1), produce_s=(4.0, 8.0)),
    "large": Shape(requests=(20, 60), operator=(2, 5), faults=(0, 2), produce_s=(6.0, 15.0)),
}


RETRYABLE = (503, 500, 429)
FINAL = (401, 400)


def _plan(rng: random.Random) -> tuple[dict[str, Any] | None, str]:
    """A request's planned failures and where it should end: `ok` (first call), `retried`
    (fails then succeeds), `dead` (fails every attempt) or `dead_now` (a final error)."""
    roll = rng.random()
    if roll < 0.5:
        return None, "ok"
    if roll < 0.75:
        status = rng.choice(RETRYABLE)
        plan = {"fail_times": rng.choice((1, 1, 2, 3)), "status": status, "retry_after": 1 if status == 429 else None}
        return plan, "retried"
    if roll < 0.88:
        return {"fail_times": rng.choice((4, 9)), "status": rng.choice(RETRYABLE[:2]), "retry_after": None}, "dead"
    return {"fail_times": 1, "status": rng.choice(FINAL), "retry_after": None}, "dead_now"


def generate(seed: int, size: str = "small") -> History:
    """A random history from `random.Random(seed)`: requests with planned failures,
    duplicates, bad records, operator actions and faults, at random moments."""
    rng = random.Random(seed)
    shape = SIZES[size]
    produce_s = rng.uniform(*shape.produce_s)
    events: list[Event] = []
    fate: dict[str, str] = {}
    for i in range(rng.randint(*shape.requests)):
        rid = f"r{i}"
        plan, fate[rid] = _plan(rng)
        skew = rng.choice((0, 0, 0, rng.randint(-300_000, 300_000)))
        events.append(
            Event(
                round(rng.uniform(0, produce_s), 2),
                "request",
                {"id": rid, "plan": plan, "keyed": rng.random() < 0.6, "skew_ms": skew, "partition": None},
            )
        )
    ids = list(fate)
    parked_ids = [r for r in ids if fate[r] in ("retried", "dead")]
    dead_ids = [r for r in ids if fate[r] in ("dead", "dead_now")]
    sent_at = {e.args["id"]: e.at for e in events}

    def later(rid: str, by: float = 0.2) -> float:
        return round(sent_at[rid] + by, 2)

    for _ in range(rng.randint(1, 4)):
        rid = rng.choice(ids)
        after = rng.choice(
            ["sent", "succeeded" if fate[rid] in ("ok", "retried") else "dead_lettered"]
            + (["parked"] if rid in parked_ids else [])
        )
        events.append(
            Event(
                later(rid, rng.uniform(0.05, 3)),
                "duplicate",
                {"id": rid, "after": after, "keyed": rng.random() < 0.5, "skew_ms": rng.choice((0, -300_000, 300_000))},
            )
        )
    for _ in range(rng.randint(0, 2)):
        rid = rng.choice(parked_ids or ids)
        events.append(
            Event(
                later(rid, 0.3),
                "invalid_copy",
                {
                    "id": rid,
                    "form": rng.choice(("no_messages", "no_messages", "non_json")),
                    "after": "parked" if rid in parked_ids else "sent",
                    "keyed": rng.random() < 0.7,
                },
            )
        )
    for bad in range(rng.randint(0, 2)):
        kind = rng.choice(("near_limit", "oversize", "null", "burst"))
        at = round(rng.uniform(0, produce_s), 2)
        bad_args: dict[str, Any]
        if kind == "near_limit":
            bad_args = {
                "id": f"big{bad}",
                "form": rng.choice(("non_json", "json")),
                "size": MAX_MESSAGE_BYTES - rng.randint(300, 1200),
                "partition": rng.choice((0, None)),
            }
        elif kind == "oversize":
            bad_args = {"id": f"over{bad}", "size": rng.randint(MAX_PAYLOAD_BYTES + 1, 4 * MAX_PAYLOAD_BYTES)}
        elif kind == "null":
            bad_args = {"key": f"null{bad}", "partition": rng.choice((None, 0))}
        else:
            bad_args = {"prefix": f"burst{bad}-", "count": rng.randint(20, 200), "form": "no_messages"}
        events.append(Event(at, kind, bad_args))

    operator_from = produce_s + 7.0  # retries of 1s,2s,3s have ended by then
    for _ in range(rng.randint(*shape.operator)):
        action = rng.choice(("replay", "replay", "replay_all", "replay_all", "discard", "run_now", "dead_letter_now"))
        via = "cli" if rng.random() < 0.3 else "http"
        at = round(operator_from + rng.uniform(0, 6), 2)
        if action in ("run_now", "dead_letter_now"):
            if not parked_ids:
                continue
            rid = rng.choice(parked_ids)
            events.append(Event(later(rid, rng.uniform(0.3, 1.5)), action, {"id": rid, "via": via}))
        elif action == "replay_all":
            error_class = rng.choice((None, "invalid_request", "server_error", "auth_error"))
            events.append(Event(at, action, {"via": via, "error_class": error_class, "wait_for": []}))
        elif dead_ids:
            rid = rng.choice(dead_ids)
            args: dict[str, Any] = {"id": rid, "via": via}
            if action == "replay" and rng.random() < 0.3:
                args["payload"] = {"request_id": rid, "messages": [{"role": "user", "content": f"edited {rid}"}]}
            events.append(Event(at, action, args))

    faults = rng.randint(*shape.faults)
    for _ in range(faults):
        kind = rng.choice(("kill", "kill", "sigterm", "join", "broker_restart", "slow_broker"))
        at = round(rng.uniform(1.0, produce_s + 8.0), 2)
        if kind == "join":
            if any(e.kind == "join" for e in events):
                continue
            events.append(Event(at, "join"))
            events.append(Event(round(at + rng.uniform(5, 12), 2), "leave"))
        elif kind == "slow_broker":
            events.append(Event(at, kind, {"delay_ms": rng.choice((100, 200, 400)), "for_s": rng.randint(4, 10)}))
        else:
            events.append(Event(at, kind, {"worker": "w1"} if kind in ("kill", "sigterm") else {}))
    settings = _budgets(random.Random(f"budgets-{seed}"), events, produce_s)
    settings.update(_tail_read(random.Random(f"tail-read-{seed}"), events, produce_s))
    events.sort(key=lambda e: e.at)
    return History(seed, f"random-{size}-{seed}", events, settings)


def _tail_read(rng: random.Random, events: list[Event], produce_s: float) -> dict[str, str]:
    """In half the histories: few backend slots, the least read-ahead, a tail read that
    starts as soon as the door is a record or a few behind, and a flood of one tenant early
    on, so that the other requests run ahead of their turn beside every fault and operator
    action (dlqapp.kafka.tail_read)."""
    if rng.random() < 0.5:
        return {}
    at = round(rng.uniform(0, produce_s / 2), 2)
    events.append(Event(at, "flood", {"prefix": "flood-", "count": rng.randint(150, 500), "tenant": "flood"}))
    return {
        "DLQ_TAIL_READ_LAG": rng.choice(("1", "2", "5")),
        "DLQ_CONCURRENCY": rng.choice(("2", "4")),
        "DLQ_ADAPTIVE_CONCURRENCY": "false",
        "DLQ_READ_AHEAD": "1",
    }


def _budgets(rng: random.Random, events: list[Event], produce_s: float) -> dict[str, str]:
    """In half the histories: a tenant on every request, and one or two budget holds, each
    released a few seconds later. Drawn from a generator of their own, so that the rest of
    a seed's history stays what it was before budgets came in."""
    if rng.random() < 0.5:
        return {}
    for event in events:
        if event.kind == "request":
            event.args["tenant"] = rng.choice(TENANTS)
    for pair in range(rng.randint(1, 2)):
        tenant, at = rng.choice(TENANTS), round(rng.uniform(0.5, produce_s + 4.0), 2)
        events.append(Event(at, "budget_hold", {"tenant": tenant, "pair": pair}))
        events.append(Event(round(at + rng.uniform(2.0, 10.0), 2), "budget_release", {"tenant": tenant, "pair": pair}))
    return {"DLQ_PRICES": PRICES}


# -- the three cases of issue #39 ----------------------------------------------------------


def invalid_copy_replayed_while_parked() -> History:
    """Case 1: X fails once (503) and is parked for 20 s; an invalid copy under X is
    dead-lettered; the operator replays every `invalid_request` dead letter. X must still
    end with one outcome."""
    events = [
        Event(0.0, "request", {"id": "X", "plan": {"fail_times": 1, "status": 503}, "keyed": True}),
        Event(0.5, "invalid_copy", {"id": "X", "form": "no_messages", "after": "parked", "keyed": True}),
        Event(2.0, "replay_all", {"via": "http", "error_class": "invalid_request", "wait_for": ["X"]}),
    ]
    return History(None, "case1-invalid-copy-replayed-while-parked", events, {"DLQ_RETRY_DELAYS": "20s,40s,60s"}, 60)


def sigterm_during_dead_letter_burst(count: int = 2000) -> History:
    """Case 2: `count` requests without `messages` at full speed, SIGTERM 4 s in: the
    worker must exit within DLQ_DRAIN_TIMEOUT + 5 s and stay stopped (then it is started
    again and every bad record must reach the DLQ)."""
    events = [
        Event(0.0, "burst", {"prefix": "nomsg-", "count": count, "form": "no_messages"}),
        Event(4.0, "sigterm", {"worker": "w1"}),
    ]
    return History(None, "case2-sigterm-during-dead-letter-burst", events, {}, 90)


def record_at_the_size_limit(followers: int = 20) -> History:
    """Case 3: a non-JSON record of 1 MiB minus 400 bytes on partition 0, then `followers`
    valid requests on partition 0: all must end, and the worker must not restart in a loop."""
    events = [
        Event(0.0, "near_limit", {"id": "big", "form": "non_json", "size": MAX_MESSAGE_BYTES - 400, "partition": 0})
    ]
    events += [
        Event(0.5, "request", {"id": f"after{i}", "plan": None, "keyed": False, "partition": 0})
        for i in range(followers)
    ]
    return History(None, "case3-record-at-the-size-limit", events, {}, 60)


def kill_during_bad_burst(count: int = 2000) -> History:
    """Found by the checker (not in the issue): `count` invalid records, then kill -9 of
    the worker once a fifth of them are in the DLQ. No state guards an invalid record, so
    each one handled since the last offset commit is dead-lettered again by the restarted
    worker: its chain gets two dead letters (rule a), and the counts drift (rule e)."""
    events = [
        Event(0.0, "burst", {"prefix": "nomsg-", "count": count, "form": "no_messages"}),
        Event(0.0, "request", {"id": "ok", "plan": None, "keyed": True}),
        Event(0.5, "kill", {"worker": "w1", "when_stats": {"dlq_size": count // 5}}),
    ]
    return History(None, "case4-kill-during-bad-burst", events, {}, 60)


def kill_right_after_replays(count: int = 40) -> History:
    """The issue's first suspect path, seen from outside: `count` requests that fail their
    first two calls with 401 (each dead-lettered at once), replayed in bulk (each fails
    again: a second dead letter, now of the replay's chain), then kill -9 of the worker
    meanwhile. A replay whose input offset was not committed yet is read again by the
    restarted worker; its state says `dead_lettered`, not a duplicate, so it runs again
    (a third call, which succeeds): one chain, a dead letter and a result (rule a). The
    kill waits until half the replays were made."""
    events = [
        Event(0.0, "request", {"id": f"x{i}", "plan": {"fail_times": 2, "status": 401}, "keyed": True})
        for i in range(count)
    ]
    ids = [f"x{i}" for i in range(count)]  # every one dead-lettered first, however busy the machine
    events.append(Event(4.0, "replay_all", {"via": "http", "error_class": "auth_error", "wait_for": ids}))
    events.append(Event(4.1, "kill", {"worker": "w1", "when_stats": {"reprocessed": count // 2}}))
    return History(None, "case5-kill-right-after-replays", events, {}, 60)


def start_during_broker_restart() -> History:
    """Found by a random history (seed 7202, shrunk): kill -9 of the worker, which starts
    again at once, and the broker restarted a few seconds later, while the new worker joins
    its group. The restarting broker answered metadata without the topics for a moment; the
    worker, the group's leader, assigned their partitions to nobody and aiokafka asked again
    only at its next metadata refresh, 5 minutes on: the worker owned nothing, every request
    without an outcome (rules c and e)."""
    plans: list[dict[str, Any] | None] = [None, {"fail_times": 1, "status": 500}, {"fail_times": 9, "status": 500}]
    events = [
        Event(round(0.2 * i, 2), "request", {"id": f"s{i}", "plan": plans[i % 3], "keyed": i % 2 == 0})
        for i in range(12)
    ]
    events += [Event(5.8, "kill", {"worker": "w1"}), Event(8.6, "broker_restart", {})]
    return History(None, "case6-start-during-broker-restart", events, {}, 60)


def clean_baseline() -> History:
    """No fault and no bad record: requests that succeed at once, after retries (503, 429
    with Retry-After), or end in the DLQ (500 every time, 401), duplicates while parked and
    after success, producer clocks 2 minutes off, and every operator action (run now,
    dead-letter now, replay, replay edited, replay by CLI, discard, replay all of a class).
    It must break no rule: the checker's own control."""
    plans: list[dict[str, Any] | None] = [
        None,
        {"fail_times": 1, "status": 503},
        {"fail_times": 2, "status": 429, "retry_after": 1},
        {"fail_times": 9, "status": 500},
        {"fail_times": 1, "status": 401},
        {"fail_times": 4, "status": 503},
    ]
    events = [
        Event(
            round(0.2 * i, 2),
            "request",
            {"id": f"c{i}", "plan": plans[i % 6], "keyed": i % 2 == 0, "skew_ms": (0, 120_000, -120_000)[i % 3]},
        )
        for i in range(12)
    ]
    edited = {"request_id": "c5", "messages": [{"role": "user", "content": "edited"}]}
    events += [
        Event(1.0, "duplicate", {"id": "c0", "after": "succeeded", "keyed": True}),
        Event(1.0, "duplicate", {"id": "c1", "after": "parked", "keyed": False}),
        Event(1.5, "run_now", {"id": "c9", "via": "http"}),
        Event(1.5, "dead_letter_now", {"id": "c3", "via": "cli"}),
        Event(12.0, "replay", {"id": "c4", "via": "http"}),
        Event(12.5, "replay", {"id": "c10", "via": "cli"}),
        Event(13.0, "replay", {"id": "c5", "via": "http", "payload": edited}),
        Event(13.5, "discard", {"id": "c11", "via": "http"}),
        Event(14.0, "replay_all", {"via": "http", "error_class": "server_error", "wait_for": []}),
    ]
    events.sort(key=lambda e: e.at)
    return History(None, "clean-baseline", events, {}, 60)


NAMED = {
    "clean": clean_baseline,
    "case1": invalid_copy_replayed_while_parked,
    "case2": sigterm_during_dead_letter_burst,
    "case3": record_at_the_size_limit,
    "case4": kill_during_bad_burst,
    "case5": kill_right_after_replays,
    "case6": start_during_broker_restart,
}
