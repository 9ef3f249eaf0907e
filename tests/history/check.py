"""The history checker: pure functions over what tests/history/run.py collected.

Each rule is a function `collected -> list[Violation]`, named after the promise it checks
(issue #39). `check_all` runs them all. Nothing here talks to Kafka or a worker, so the
rules are unit-tested on hand-made data (tests/unit/history/).

Words used below:
- an *outcome* is a committed, non-tombstone record on `results` or `dlq` (read with
  read_committed once the topics went quiet);
- its *chain* is (record key, `source` header): where the request's chain entered dlqapp
  (a produced record's position on `input`, or a replay's);
- a *valid id* is the request id of a valid request the producer sent;
- a key *belongs to* id X when it is X or starts with `X~` (an invalid copy's dead letter:
  `X~<class>~<digest>`).

The rules (each function's docstring and body say exactly how):
- a. one outcome per chain: no (key, source) has two outcomes, of either kind;
- b. a replay answered `reprocessed` with `replay_count: n` for X (or an invalid copy of
  X) ends with exactly one outcome belonging to X whose `replay_count` header is n (a bulk
  or CLI answer names only keys: n is then read from X's ledger entries of that moment);
- c. nothing lost: every valid id (and every id readable in an invalid record that the API
  knows) ends settled (`succeeded`, `dead_lettered`, `discarded`); a valid id has an
  outcome keyed by itself; `succeeded` has a result; `dead_lettered` has a dead letter
  that is still live on the compacted topic;
- d. no paying twice: no call in the mock's log for X after X's first committed result
  (its record timestamp + 500 ms), unless a forced replay of X was asked before that call;
- e. counts equal the topics (see `expected_counts` and `rule_e_counts`);
- f. retries on time: no attempt in an outcome's attempt history started more than 5 s
  after its `scheduled` time unless a fault's window (start, end + 5 s) overlaps
  [scheduled, start], or a budget hold of its tenant's (from the hold asked until its release
  answered, + 5 s) does; none started before it unless an operator pressed run-now for it.
  The workers run with DLQ_BREAKER=false (tests.support.Worker), so the breaker never
  holds a retry and needs no exemption;
- g. stops: each SIGTERM ends its process within DLQ_DRAIN_TIMEOUT + 5 s, with no restart
  line or `ready` line logged after the signal, and the pid gone;
- h. no restart loop: a worker process logs no more restarts in place (max of the
  `restarting the worker` lines and the `ready` lines less one) than faults injected
  while it ran (its own kill or SIGTERM and a crash revival not counted);
- i. bad input kept: every invalid, near-limit, oversize or null record produced has a
  dead letter whose `source` is its position and whose value is its bytes (a null one:
  the `payload_null` header);
- j. no crash: no worker process ends while nobody stopped it (the runner then starts it
  again, as an orchestrator would, so the rest of the history still runs);
- k. delayed, never failed: a request whose plan lets it succeed within its tiers (no
  failure planned, or a retryable one no more times than there are tiers) ends
  `succeeded` once settled, whatever held it meanwhile (a budget hold, a fault, a bad copy
  under its id); not judged when an operator dead-lettered it on purpose.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tests.history.generate import BASE_SETTINGS, RETRYABLE

SETTLED = ("succeeded", "dead_lettered", "discarded")
CLOCK_SLACK_MS = 500
"""Rule d: a call this close after the first result is taken as before it (clocks, rounding)."""
LATE_MS = 5000
"""Rule f: no attempt may start more than this after its scheduled time."""
FAULT_TAIL_MS = 5000
"""Rule f: a fault excuses lateness from its start until this long after it ended."""
MAX_PER_RULE = 20
"""More violations of one rule than this are summed up in one (with examples)."""


@dataclass
class Violation:
    rule: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        evidence = json.dumps(self.evidence, default=str)
        return f"[{self.rule}] {self.message}\n    evidence: {evidence[:1500]}"


# -- reading what was collected ----------------------------------------------------------


def owner_id(key: str) -> str:
    parts = key.split("~")
    return parts[0] if len(parts) >= 3 else key


def belongs_to(key: str | None, rid: str) -> bool:
    return key is not None and (key == rid or key.startswith(rid + "~"))


def outcomes(c: dict[str, Any]) -> list[dict[str, Any]]:
    return [o for o in c["outcomes"] if not o["tombstone"]]


def source_of(o: dict[str, Any]) -> tuple[Any, ...] | None:
    raw = o["headers"].get("source")
    if raw is None:
        return None
    try:
        src = json.loads(raw)
        return (src.get("topic"), src.get("partition"), src.get("offset"))
    except (ValueError, AttributeError):
        return ("unparsed", raw)


def brief(o: dict[str, Any]) -> dict[str, Any]:
    """An outcome as evidence: where it is, its key, chain and lineage."""
    h = o["headers"]
    return {
        "at": f"{o['topic']}[{o['partition']}]@{o['offset']}",
        "key": o["key"],
        "ts": o["timestamp"],
        "source": h.get("source"),
        "replay_count": h.get("replay_count"),
        "error_class": h.get("error_class"),
        "attempts": (o.get("result") or {}).get("attempts", h.get("attempts")),
    }


def valid_ids(c: dict[str, Any]) -> list[str]:
    return sorted({p["id"] for p in c["produced"] if p["valid"]})


def request_body(c: dict[str, Any], rid: str) -> dict[str, Any] | None:
    answer = c["requests"].get(rid)
    if not answer or answer.get("status") != 200 or not isinstance(answer.get("body"), dict):
        return None
    return answer["body"]


def live_dlq_keys(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The compacted `dlq` topic's view: each key's last record, when it is not a tombstone."""
    last: dict[str, dict[str, Any]] = {}
    for o in sorted((o for o in c["outcomes"] if o["topic"] == "dlq"), key=lambda o: (o["partition"], o["offset"])):
        last[o["key"]] = o
    return {k: o for k, o in last.items() if not o["tombstone"]}


def answered_ok(op: dict[str, Any]) -> bool:
    return (op["via"] == "http" and op["status"] in (200, 202)) or (op["via"] == "cli" and op["status"] == 0)


def replays_answered(c: dict[str, Any]) -> list[dict[str, Any]]:
    """Every replay the API (or the CLI) answered `reprocessed`: its key, owner id and
    replay_count (from the answer, else from the owner's ledger entries of that moment)."""
    found = []
    for op in c["operator"]:
        if op["action"] not in ("replay", "replay_all"):
            continue
        body = op["body"] if isinstance(op["body"], dict) else {}
        if body.get("status") == "reprocessed":
            keys = [body["request_id"]]
        else:
            keys = [k for k in body.get("reprocessed", []) if isinstance(k, str)]
        by_owner: dict[str, list[str]] = defaultdict(list)
        for key in keys:
            by_owner[owner_id(key)].append(key)
        for rid, owned in by_owner.items():
            if body.get("status") == "reprocessed" and isinstance(body.get("replay_count"), int):
                counts: list[int | None] = [body["replay_count"]]
            else:
                ledger = (request_body(c, rid) or {}).get("ledger") or []
                counts = sorted(
                    e["replay_count"]
                    for e in ledger
                    if e.get("action") == "replay"
                    and op["asked_ms"] - 2000 <= e.get("at", 0) <= op["answered_ms"] + 2000
                )
                counts = (counts + [None] * len(owned))[: len(owned)]
            for key, n in zip(owned, counts, strict=True):
                found.append({"key": key, "id": rid, "replay_count": n, "event": op["event"], "via": op["via"]})
    return found


# -- a. one outcome per chain ------------------------------------------------------------------


def rule_a_one_outcome_per_chain(c: dict[str, Any]) -> list[Violation]:
    chains: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    found = []
    for o in outcomes(c):
        src = source_of(o)
        if src is None:
            found.append(Violation("a.source_header", f"outcome without a source header: {o['key']}", brief(o)))
            continue
        chains[(o["key"], src)].append(o)
    for (key, src), group in sorted(chains.items(), key=lambda kv: str(kv[0])):
        if len(group) > 1:
            kinds = Counter(o["topic"] for o in group)
            found.append(
                Violation(
                    "a.one_outcome_per_chain",
                    f"chain {key} from {src} has {len(group)} outcomes ({dict(kinds)})",
                    {"outcomes": [brief(o) for o in group]},
                )
            )
    return found


# -- b. every replay ends with one outcome ------------------------------------------------------


def rule_b_replay_outcome(c: dict[str, Any]) -> list[Violation]:
    found = []
    outs = outcomes(c)
    for replay in replays_answered(c):
        rid, n = replay["id"], replay["replay_count"]
        if n is None:
            found.append(
                Violation(
                    "b.replay_outcome",
                    f"replay of {replay['key']} answered reprocessed, but no ledger entry gives its replay_count",
                    {"replay": replay, "ledger": (request_body(c, rid) or {}).get("ledger")},
                )
            )
            continue
        mine = [o for o in outs if belongs_to(o["key"], rid) and o["headers"].get("replay_count") == str(n)]
        if len(mine) != 1:
            found.append(
                Violation(
                    "b.replay_outcome",
                    f"replay {n} of {rid} (key {replay['key']}) has {len(mine)} outcomes, not 1",
                    {
                        "replay": replay,
                        "outcomes": [brief(o) for o in mine],
                        "all_of_id": [brief(o) for o in outs if belongs_to(o["key"], rid)],
                        "state": (request_body(c, rid) or {}).get("state"),
                    },
                )
            )
    return found


# -- c. nothing lost -------------------------------------------------------------------------------


def rule_c_nothing_lost(c: dict[str, Any]) -> list[Violation]:
    found = []
    outs = outcomes(c)
    live = live_dlq_keys(c)
    salvaged = {p["id"] for p in c["produced"] if p["bad"] and p["id"] and p["kind"] != "burst"}
    for rid in sorted(set(valid_ids(c)) | salvaged):
        valid = rid in valid_ids(c)
        body = request_body(c, rid)
        mine = [o for o in outs if belongs_to(o["key"], rid)]
        evidence = {
            "id": rid,
            "outcomes": [brief(o) for o in mine],
            "request": body if body is not None else c["requests"].get(rid),
        }
        if body is None:
            if valid:
                found.append(Violation("c.known", f"GET /requests/{rid}/ does not know it", evidence))
            continue
        state = body.get("state")
        if state not in SETTLED:
            found.append(Violation("c.settled", f"{rid} ends in state {state!r}, not settled", evidence))
        if valid and not any(o["key"] == rid for o in mine):
            found.append(Violation("c.has_outcome", f"{rid} has no outcome of its own (key {rid})", evidence))
        if state == "succeeded" and not any(o["topic"] == "results" and o["key"] == rid for o in mine):
            found.append(Violation("c.succeeded_has_result", f"{rid} is succeeded but has no result", evidence))
        if state == "dead_lettered":
            if not any(o["topic"] == "dlq" for o in mine):
                found.append(
                    Violation(
                        "c.dead_lettered_has_dead_letter", f"{rid} is dead_lettered but has no dead letter", evidence
                    )
                )
            elif not any(belongs_to(k, rid) for k in live):
                found.append(
                    Violation(
                        "c.dead_lettered_has_dead_letter",
                        f"{rid} is dead_lettered but every dead letter of it was tombstoned",
                        evidence,
                    )
                )
    return found


# -- d. no paying twice ------------------------------------------------------------------------------


def rule_d_no_call_after_success(c: dict[str, Any]) -> list[Violation]:
    first_result: dict[str, dict[str, Any]] = {}
    for o in outcomes(c):
        if o["topic"] == "results" and (
            o["key"] not in first_result or o["timestamp"] < first_result[o["key"]]["timestamp"]
        ):
            first_result[o["key"]] = o
    forced: dict[str, int] = {}
    for op in c["operator"]:
        if op["action"] == "replay" and (op.get("asked") or {}).get("force") and op.get("id"):
            forced[op["id"]] = min(forced.get(op["id"], op["asked_ms"]), op["asked_ms"])
    late: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for call in c["calls"]:
        rid = call["request_id"]
        result = first_result.get(rid)
        if result is None or call["at_ms"] <= result["timestamp"] + CLOCK_SLACK_MS:
            continue
        if rid in forced and call["at_ms"] >= forced[rid]:
            continue
        late[rid].append(call)
    return [
        Violation(
            "d.no_call_after_success",
            f"{rid} was called {len(calls)} time(s) after its first committed result",
            {"result": brief(first_result[rid]), "calls": calls[:10]},
        )
        for rid, calls in sorted(late.items())
    ]


# -- e. counts equal the topics ------------------------------------------------------------------------


def _valid_replay_shas(c: dict[str, Any]) -> set[str]:
    """Digests of the valid request bytes a replay can carry: the produced valid ones and
    the operator's edits (sent as `json.dumps(payload)`)."""
    shas = {p["sha256"] for p in c["produced"] if p["valid"]}
    for op in c["operator"]:
        payload = (
            (c["history"]["events"][op["event"]]["args"] or {}).get("payload")
            if op["event"] < len(c["history"]["events"])
            else None
        )
        if payload is not None:
            shas.add(hashlib.sha256(json.dumps(payload).encode()).hexdigest())
    return shas


def duplicates_by_id(c: dict[str, Any]) -> dict[str, int]:
    """For each valid id: its valid request records that reached dlqapp (produced, and
    replays carrying valid bytes) less the chains they started (distinct sources on
    `input` of its own outcomes). Each record either starts a chain or is skipped."""
    valid = set(valid_ids(c))
    shas = _valid_replay_shas(c)
    records = Counter(p["id"] for p in c["produced"] if p["valid"])
    records.update(r["key"] for r in c["replays_on_input"] if r["sha256"] in shas and r["key"] in valid)
    input_topic = c["topics"]["input"]
    chains = Counter(
        key
        for key, src in {(o["key"], source_of(o)) for o in outcomes(c)}
        if key in valid and src is not None and src[0] == input_topic
    )
    return {rid: records[rid] - chains[rid] for rid in sorted(valid)}


def clean_ids(c: dict[str, Any]) -> set[str]:
    """The valid ids that ended settled and with an outcome of their own (rule c holds)."""
    own = {o["key"] for o in outcomes(c)}
    return {rid for rid in valid_ids(c) if rid in own and (request_body(c, rid) or {}).get("state") in SETTLED}


def expected_counts(c: dict[str, Any]) -> dict[str, Any]:
    """What `GET /dlq/stats/` should say, from the topics and what was produced:

    - received: distinct request ids the producer sent (valid, or readable in an invalid
      record: JSON with a `request_id`) plus each produced record without one (null, non-JSON);
    - succeeded: distinct keys on `results`;
    - dead_lettered (by class): dead letters on `dlq` (every committed, non-tombstone record);
    - dlq_size, dlq_by_error_class: live keys of the compacted `dlq` topic;
    - reprocessed: replays on `input` (records with a `replay_of` header);
    - retried per tier: records on each tier topic;
    - duplicates_skipped: the sum of `duplicates_by_id`.
    """
    outs = outcomes(c)
    live = live_dlq_keys(c)
    return {
        "received": len({p["id"] for p in c["produced"] if p["id"]}) + sum(1 for p in c["produced"] if not p["id"]),
        "succeeded": len({o["key"] for o in outs if o["topic"] == "results"}),
        "dead_lettered": dict(
            Counter(o["headers"].get("error_class") or "unknown" for o in outs if o["topic"] == "dlq")
        ),
        "dlq_size": len(live),
        "dlq_by_error_class": dict(Counter(o["headers"].get("error_class") or "unknown" for o in live.values())),
        "reprocessed": len(c["replays_on_input"]),
        "retried": {topic: n for topic, n in c["tier_counts"].items() if n},  # the stats leave zeros out
        "duplicates_skipped": sum(duplicates_by_id(c).values()),
    }


def rule_e_counts(c: dict[str, Any]) -> list[Violation]:
    """The stats against `expected_counts`. `received` and `duplicates_skipped` are compared
    only when every valid id ended settled with an outcome of its own (else rule c says
    what is wrong, and these totals cannot be known); per id, each clean id's `duplicates`
    (GET /requests/{id}/) must equal its `duplicates_by_id`. GET /dlq/ must list the live
    dlq keys, each once, and total them."""
    stats = c["stats"]
    if stats.get("status") != 200 or not isinstance(stats.get("body"), dict):
        return [Violation("e.stats", "GET /dlq/stats/ did not answer", {"answer": stats})]
    said = stats["body"]
    want = expected_counts(c)
    clean = clean_ids(c)
    all_clean = clean == set(valid_ids(c))
    found = []

    def compare(name: str, said_value: Any, want_value: Any, how: str) -> None:
        if said_value != want_value:
            found.append(
                Violation(
                    f"e.{name}",
                    f"stats {name} = {said_value}, the topics say {want_value} ({how})",
                    {"stats": said_value, "topics": want_value},
                )
            )

    if all_clean:
        compare("received", said.get("received"), want["received"], "distinct ids sent + records without an id")
        compare(
            "duplicates_skipped",
            said.get("duplicates_skipped"),
            want["duplicates_skipped"],
            "valid request records received less the chains they started",
        )
    compare("succeeded", said.get("succeeded"), want["succeeded"], "distinct keys on results")
    compare(
        "dead_lettered", said.get("dead_lettered") or {}, want["dead_lettered"], "dead letters on dlq by error_class"
    )
    compare("dlq_size", said.get("dlq_size"), want["dlq_size"], "live keys on the compacted dlq topic")
    compare(
        "dlq_by_error_class",
        said.get("dlq_by_error_class") or {},
        want["dlq_by_error_class"],
        "live dlq keys by error_class",
    )
    compare("reprocessed", said.get("reprocessed"), want["reprocessed"], "replays on input")
    compare("retried", said.get("retried") or {}, want["retried"], "records on each tier topic")
    expected_dups = duplicates_by_id(c)
    for rid in sorted(clean):
        recorded = (request_body(c, rid) or {}).get("duplicates")
        if recorded != expected_dups[rid]:
            found.append(
                Violation(
                    "e.duplicates_skipped",
                    f"{rid} counts {recorded} duplicate(s) skipped; the topics show {expected_dups[rid]}"
                    " (its valid records less the chains they started)",
                    {
                        "id": rid,
                        "produced": [
                            {k: p[k] for k in ("kind", "partition", "offset", "skew_ms")}
                            for p in c["produced"]
                            if p["valid"] and p["id"] == rid
                        ],
                        "replays": [r for r in c["replays_on_input"] if r["key"] == rid],
                        "outcomes": [brief(o) for o in outcomes(c) if o["key"] == rid],
                        "history": [
                            h
                            for h in (request_body(c, rid) or {}).get("history") or []
                            if h.get("state") == "duplicate_skipped"
                        ],
                    },
                )
            )
    listing = c["dlq_listing"]
    if listing.get("status") != 200:
        found.append(Violation("e.dlq_listing", "GET /dlq/ did not answer", {"answer": listing}))
    else:
        compare("dlq_listing_total", listing.get("total"), want["dlq_size"], "GET /dlq/ total vs live dlq keys")
        listed, live = Counter(listing["keys"]), set(live_dlq_keys(c))
        if set(listed) != live or any(n > 1 for n in listed.values()):
            found.append(
                Violation(
                    "e.dlq_listing_keys",
                    "GET /dlq/ lists other keys than the live keys of the dlq topic",
                    {
                        "listed_not_live": sorted(set(listed) - live)[:20],
                        "live_not_listed": sorted(live - set(listed))[:20],
                        "listed_twice": sorted(k for k, n in listed.items() if n > 1)[:20],
                    },
                )
            )
    return found


# -- f. retries on time ------------------------------------------------------------------------------


def attempts_of(o: dict[str, Any]) -> list[dict[str, Any]]:
    if o["topic"] == "results":
        return list((o.get("result") or {}).get("history") or [])
    try:
        history = json.loads(o["headers"].get("attempt_history") or "[]")
    except ValueError:
        return []
    return [a for a in history if isinstance(a, dict)]


def excused(c: dict[str, Any], start_ms: int, end_ms: int) -> list[dict[str, Any]]:
    """The faults whose window (from their start until FAULT_TAIL_MS after they ended)
    overlaps [start_ms, end_ms]."""
    return [
        f for f in c["faults"] if f["start_ms"] <= end_ms and start_ms <= (f["end_ms"] or f["start_ms"]) + FAULT_TAIL_MS
    ]


def holds_of(c: dict[str, Any]) -> dict[str, list[tuple[int, int | None]]]:
    """Tenant → its budget holds: (hold asked, its release answered; None: never released)."""
    released = {
        (op["asked"]["tenant"], op["asked"]["pair"]): op["answered_ms"]
        for op in c["operator"]
        if op["action"] == "budget_release"
    }
    holds: dict[str, list[tuple[int, int | None]]] = defaultdict(list)
    for op in c["operator"]:
        if op["action"] == "budget_hold":
            tenant = op["asked"]["tenant"]
            holds[tenant].append((op["asked_ms"], released.get((tenant, op["asked"]["pair"]))))
    return holds


def held(c: dict[str, Any], tenant: str | None, start_ms: int, end_ms: int) -> bool:
    """Whether a budget hold of `tenant` (until FAULT_TAIL_MS after its release) overlaps [start_ms, end_ms]."""
    return any(
        hold <= end_ms and (release is None or start_ms <= release + FAULT_TAIL_MS)
        for hold, release in holds_of(c).get(tenant or "", [])
    )


def rule_f_retries_on_time(c: dict[str, Any]) -> list[Violation]:
    found = []
    run_now = {op["id"] for op in c["operator"] if op["action"] == "run_now" and op.get("id")}
    tenants = {p["id"]: p.get("tenant") for p in c["produced"] if p["valid"] and p.get("id")}
    seen = set()
    for o in outcomes(c):
        for a in attempts_of(o):
            due, at = a.get("scheduled"), a.get("at")
            if not isinstance(due, int) or not isinstance(at, int):
                continue
            ident = (owner_id(o["key"]), a.get("attempt"), at)
            if ident in seen:
                continue
            seen.add(ident)
            evidence = {"outcome": brief(o), "attempt": a, "late_ms": at - due}
            late = at - due > LATE_MS
            if late and not excused(c, due, at) and not held(c, tenants.get(owner_id(o["key"])), due, at):
                found.append(
                    Violation(
                        "f.retry_late",
                        f"{o['key']} attempt {a.get('attempt')} started {at - due} ms after it was due",
                        evidence,
                    )
                )
            if at < due and owner_id(o["key"]) not in run_now:
                found.append(
                    Violation(
                        "f.retry_early",
                        f"{o['key']} attempt {a.get('attempt')} started {due - at} ms before it was due",
                        evidence,
                    )
                )
    return found


# -- g. stops ---------------------------------------------------------------------------------------------


def rule_g_stops(c: dict[str, Any]) -> list[Violation]:
    found = []
    for stop in c["sigterms"]:
        bound = stop["bound_s"]
        if stop["exit_s"] is None:
            found.append(
                Violation(
                    "g.stops",
                    f"{stop['worker']} (pid {stop['pid']}) was still running long after SIGTERM (then killed)",
                    stop,
                )
            )
        elif stop["exit_s"] > bound:
            found.append(
                Violation("g.stops", f"{stop['worker']} took {stop['exit_s']} s to stop, over {bound} s", stop)
            )
        if stop["restart_lines_after_signal"] or stop["ready_lines_after_signal"]:
            found.append(
                Violation(
                    "g.stays_stopped", f"{stop['worker']} (pid {stop['pid']}) restarted itself after SIGTERM", stop
                )
            )
        if not stop["pid_gone"]:
            found.append(
                Violation("g.stays_stopped", f"pid {stop['pid']} still exists after {stop['worker']} stopped", stop)
            )
    return found


# -- h. no restart loop -------------------------------------------------------------------------------------


def rule_h_no_restart_loop(c: dict[str, Any]) -> list[Violation]:
    found = []
    end = max(
        [f["end_ms"] or 0 for f in c["faults"]] + [r.get("ended_ms") or 0 for r in c["worker_runs"]] + [c["started_ms"]]
    )
    for run in c["worker_runs"]:
        restarts = max(run["restarts"], run["ready_lines"] - 1)
        until = run.get("ended_ms") or end
        faults = [
            f
            for f in c["faults"]
            if run["started_ms"] <= f["start_ms"] <= until
            and f["kind"] != "revival"
            and not (f.get("worker") == run["worker"] and f["kind"] in ("kill", "sigterm", "leave"))
        ]
        if restarts > len(faults):
            found.append(
                Violation(
                    "h.no_restart_loop",
                    f"{run['worker']} (pid {run.get('pid')}) restarted in place {restarts} time(s)"
                    f" with {len(faults)} fault(s) injected meanwhile",
                    {"run": run, "faults": faults},
                )
            )
    return found


# -- i. bad input never dropped ---------------------------------------------------------------------------------


def rule_i_bad_input_kept(c: dict[str, Any]) -> list[Violation]:
    by_source: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for o in outcomes(c):
        if o["topic"] == "dlq":
            by_source[source_of(o) or ()].append(o)
    input_topic = c["topics"]["input"]
    found = []
    for p in c["produced"]:
        if not p["bad"]:
            continue
        letters = by_source.get((input_topic, p["partition"], p["offset"]), [])
        what = f"{p['kind']} record at input[{p['partition']}]@{p['offset']} ({p['len']} bytes, id {p['id']})"
        if not letters:
            found.append(Violation("i.bad_input_kept", f"no dead letter for the {what}", {"produced": p}))
            continue
        if p["null"]:
            ok = any(o["headers"].get("payload_null") == "true" for o in letters)
        else:
            ok = any(o["sha256"] == p["sha256"] and o["len"] == p["len"] for o in letters)
        if not ok:
            found.append(
                Violation(
                    "i.bad_input_kept",
                    f"the dead letter of the {what} does not keep its bytes",
                    {
                        "produced": p,
                        "dead_letters": [{**brief(o), "len": o["len"], "sha256": o["sha256"]} for o in letters],
                    },
                )
            )
    return found


# -- j. workers end only when told --------------------------------------------------------------------------------


FAILED_AT_START_EXIT_CODE = 75
"""dlqapp's exit code for a worker whose transactions failed before it was ever ready."""


def rule_j_no_crash(c: dict[str, Any]) -> list[Violation]:
    """A worker process that ended while nobody stopped it (the runner then started it
    again, as an orchestrator would). Not counted: a process that was never ready and
    exited with code 75 while the broker was restarting (what the docs promise then)."""
    found = []
    for run in c["worker_runs"]:
        if run.get("ended_by") != "crashed":
            continue
        broker_away = [
            f
            for f in c["faults"]
            if f["kind"] == "broker_restart"
            and f["start_ms"] <= (run.get("ended_ms") or 0)
            and run["started_ms"] <= (f["end_ms"] or f["start_ms"])
        ]
        if run.get("exit_code") == FAILED_AT_START_EXIT_CODE and not run.get("ready_ms") and broker_away:
            continue
        found.append(
            Violation(
                "j.no_crash",
                f"{run['worker']} (pid {run.get('pid')}) ended by itself with exit code {run.get('exit_code')}",
                {
                    "run": {k: run.get(k) for k in ("started_ms", "ready_ms", "ended_ms", "exit_code", "log")},
                    "log": run.get("crash_lines"),
                },
            )
        )
    return found


# -- the runner's own trouble -------------------------------------------------------------------------------------


def rule_runner(c: dict[str, Any]) -> list[Violation]:
    """What went wrong while playing (a worker that did not start again, an event that
    raised): not a rule of the product, but a history that did not run as written."""
    return [Violation("runner.error", error[:500], {}) for error in c["errors"]]


# -- k. delayed, never failed ----------------------------------------------------------------------------


def rule_k_planned_to_succeed(c: dict[str, Any]) -> list[Violation]:
    settings = {**BASE_SETTINGS, **(c["history"].get("settings") or {})}
    tiers = len([d for d in settings["DLQ_RETRY_DELAYS"].split(",") if d.strip()])
    events = c["history"]["events"]
    on_purpose = {e["args"].get("id") for e in events if e["kind"] == "dead_letter_now"}
    found = []
    flooded = [
        {"kind": "request", "args": {"id": f"{e['args']['prefix']}{i}"}}
        for e in events
        if e["kind"] == "flood"
        for i in range(e["args"]["count"])
    ]
    for event in [*events, *flooded]:
        rid, plan = event["args"].get("id"), event["args"].get("plan")
        if event["kind"] != "request" or rid in on_purpose:
            continue
        if plan and (plan["status"] not in RETRYABLE or plan["fail_times"] > tiers):
            continue
        state = (request_body(c, rid) or {}).get("state")
        if state in SETTLED and state != "succeeded":
            evidence = {"id": rid, "plan": plan, "tiers": tiers, "request": request_body(c, rid)}
            found.append(Violation("k.delayed_never_failed", f"{rid} could succeed but ends {state}", evidence))
    return found


RULES: list[Callable[[dict[str, Any]], list[Violation]]] = [
    rule_a_one_outcome_per_chain,
    rule_b_replay_outcome,
    rule_c_nothing_lost,
    rule_d_no_call_after_success,
    rule_e_counts,
    rule_f_retries_on_time,
    rule_g_stops,
    rule_h_no_restart_loop,
    rule_i_bad_input_kept,
    rule_j_no_crash,
    rule_k_planned_to_succeed,
    rule_runner,
]


def check_all(c: dict[str, Any]) -> list[Violation]:
    """Every rule's violations; more than MAX_PER_RULE of one rule are summed up in one."""
    found: list[Violation] = []
    for rule in RULES:
        violations = rule(c)
        by_name: dict[str, list[Violation]] = defaultdict(list)
        for v in violations:
            by_name[v.rule].append(v)
        for name, group in by_name.items():
            if len(group) > MAX_PER_RULE:
                found.append(
                    Violation(
                        name,
                        f"{len(group)} violations, e.g. {group[0].message}",
                        {"examples": [v.message for v in group[:10]], "first": group[0].evidence},
                    )
                )
            else:
                found.extend(group)
    return found


def rule_names(violations: list[Violation]) -> set[str]:
    return {v.rule for v in violations}


SEVERITY = (("a", "b", "c", "g", "h", "i", "j"), ("d", "f"), ("e",), ("runner",))
"""Families of rules, gravest first: a lost or doubled outcome, a stop that is no stop, a
restart loop, dropped bad input and a crash; then paying twice and late retries; then
counts; then trouble of the runner's own."""


def gravest(violations: list[Violation]) -> set[str]:
    """The rules broken in the gravest family present (what shrinking keeps failing)."""
    names = rule_names(violations)
    for family in SEVERITY:
        found = {n for n in names if n.split(".")[0] in family}
        if found:
            return found
    return names


if __name__ == "__main__":  # judge a saved run again: python -m tests.history.check <collected.json>
    import sys
    from pathlib import Path

    collected = json.loads(Path(sys.argv[1]).read_text())
    for violation in check_all(collected):
        print(violation)
