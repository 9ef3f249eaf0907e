"""How requests are worked: retry tiers, sizes, flow control, costs, the consumer, the guarantee, the timer."""

from __future__ import annotations

from dataclasses import dataclass

from dlqapp.core.budgets import BudgetTable
from dlqapp.core.prices import PriceTable, read_prices_setting
from dlqapp.flowcontrol.limits import RateLimits, parse_rate_limits
from dlqapp.settings.parsing import (
    _choice,
    _non_negative_int,
    _parse_bool,
    _parse_delays,
    _parse_rate,
    _parse_retryable,
    _parse_weights,
    _positive_duration,
    _positive_int,
    _tenant_name,
    parse_duration_ms,
    setting,
)


@dataclass(frozen=True)
class WorkFields:
    """Settings of one concern; `Settings` gathers them (see model.py)."""

    retry_delays_ms: tuple[int, ...] = setting(
        "DLQ_RETRY_DELAYS", "1s,10s,1m", _parse_delays, "Delay of each retry tier; one tier topic per delay."
    )
    backoff: str = setting(
        "DLQ_BACKOFF",
        "tiers",
        _choice("tiers", "exponential"),
        "`tiers`: each tier waits its delay exactly. `exponential`: first delay × 2^(k-1) with jitter, still through "
        "the tier topics.",
    )
    backoff_jitter: float = setting(
        "DLQ_BACKOFF_JITTER", "0.2", _parse_rate, "Fraction of an exponential delay that is randomised (0 to 1)."
    )
    max_age_ms: int = setting(
        "DLQ_MAX_AGE",
        "24h",
        parse_duration_ms,
        "A request older than this at attempt time is dead-lettered as `expired`.",
    )
    retryable_overrides: dict = setting(
        "DLQ_RETRYABLE",
        "",
        _parse_retryable,
        "Overrides of the retryable table, e.g. `context_length=true,unknown=false`.",
    )
    max_message_bytes: int = setting(
        "DLQ_MAX_MESSAGE_BYTES",
        "16777216",
        _positive_int,
        "Largest record producers may write to `input` (the input topic's max.message.bytes). dlqapp's other "
        "topics take it plus 1 MiB for dlqapp's headers (table changelogs a little more), so any record the "
        "input accepts reaches the DLQ with its bytes intact; a worker refuses to start when existing topics "
        "cannot hold that.",
    )
    max_payload_bytes: int = setting(
        "DLQ_MAX_PAYLOAD_BYTES",
        "1048576",
        _positive_int,
        "Largest accepted request payload; larger ones are dead-lettered as `invalid_request`.",
    )
    concurrency: int = setting(
        "DLQ_CONCURRENCY",
        "64",
        _positive_int,
        "Backend calls in flight at once per worker (the most the adaptive limit may reach).",
    )
    adaptive_concurrency: bool = setting(
        "DLQ_ADAPTIVE_CONCURRENCY",
        "true",
        _parse_bool,
        "Shrink the calls in flight when the backend answers 429s, times out or slows down, and grow them back when "
        "it recovers (AIMD between DLQ_CONCURRENCY_FLOOR and DLQ_CONCURRENCY).",
    )
    concurrency_floor: int = setting(
        "DLQ_CONCURRENCY_FLOOR",
        "1",
        _positive_int,
        "Adaptive concurrency never goes below this many calls in flight (at most DLQ_CONCURRENCY).",
    )
    rate_limits: RateLimits = setting(
        "DLQ_RATE_LIMITS",
        "",
        parse_rate_limits,
        "Requests and tokens per minute per model, e.g. "
        "`gpt-4o-mini=5000rpm/2000000tpm,gpt-4o=500rpm/30000tpm,*=1000rpm`; calls wait for capacity instead of being "
        "sent. Each worker takes the share of its input partitions (empty: no limits).",
    )
    prices: PriceTable = setting(
        "DLQ_PRICES",
        "",
        read_prices_setting,
        'Prices per model in USD per million tokens, JSON or the path of a JSON file: `{"gpt-4o-mini": {"input": 0.15, '
        '"cached_input": 0.075, "output": 0.6}}`; `*` prices every model not named. A model without a price is '
        "counted in tokens only (flagged `unpriced`) and no USD budget holds it (docs/costs.md).",
    )
    budgets: BudgetTable = setting(
        "DLQ_BUDGETS",
        "",
        BudgetTable.parse,
        'Budgets per UTC day and month, JSON: `{"acme": {"day_usd": 50, "month_usd": 1000}, "*": {"day_usd": 5}}` '
        "(`*`: each tenant without an entry; `model:<name>`: a model, all tenants together). A request over its "
        "budget is held (`budget_held`), never dropped. `POST /budgets/` changes them at run time.",
    )
    tenant_weights: dict[str, float] = setting(
        "DLQ_TENANT_WEIGHTS",
        "",
        _parse_weights,
        'Weights of tenants\' fair shares of backend slots, JSON: `{"acme": 3, "beta": 1}` (1 for a tenant not named).',
    )
    metrics_tenants: int = setting(
        "DLQ_METRICS_TENANTS",
        "100",
        _non_negative_int,
        "Tenants with a `tenant` label of their own on `/metrics`, beyond those named in `DLQ_BUDGETS`, "
        "`DLQ_TENANT_WEIGHTS` or a budget set at run time (always their own), in the order a worker first counts "
        "them; the others are counted under `_other` (a label per end user would swamp Prometheus). "
        "`GET /budgets/` lists every tenant.",
    )
    metrics_models: int = setting(
        "DLQ_METRICS_MODELS",
        "50",
        _non_negative_int,
        "Models with a `model` label of their own on `/metrics` beyond those the settings name (prices, budgets, "
        "rate limits, the default and fallback models), in the order a worker first counts them; the others are "
        "counted under `_other`.",
    )
    read_ahead: int = setting(
        "DLQ_READ_AHEAD",
        "50000",
        _positive_int,
        "Fresh requests a worker reads ahead while its backend slots are busy, to share them fairly between "
        "tenants (`DLQ_TENANT_WEIGHTS`): a tenant's request read behind another tenant's flood of this many starts "
        "within a round. Its offsets are committed only once the flood before it is done. Memory: bounded by "
        "`DLQ_READ_AHEAD_BYTES` too.",
    )
    read_ahead_bytes: int = setting(
        "DLQ_READ_AHEAD_BYTES",
        "67108864",
        _positive_int,
        "Memory the requests read ahead (`DLQ_READ_AHEAD`) may hold together: their payloads plus about 3 KiB "
        "each; whichever of the two limits comes first stops reading ahead.",
    )
    tail_read_lag: int = setting(
        "DLQ_TAIL_READ_LAG",
        "200",
        _non_negative_int,
        "Records an `input` partition's reading may fall behind its end before the worker reads its end too and "
        "starts the requests of tenants with little waiting there, ahead of their turn: a tenant's request that "
        "arrives behind another tenant's flood starts at once, not after the flood was read. 0: never.",
    )
    default_tenant: str = setting(
        "DLQ_DEFAULT_TENANT",
        "default",
        _tenant_name,
        "The tenant of a request whose `metadata.tenant` (and `tenant` header) names none.",
    )
    budget_recheck_ms: int = setting(
        "DLQ_BUDGET_RECHECK",
        "30s",
        _positive_duration,
        "How often a request held over its budget is looked at again (also at each UTC midnight, and at once when "
        "`POST /budgets/` raises a budget).",
    )
    max_poll_records: int = setting(
        "DLQ_MAX_POLL_RECORDS",
        "100",
        _positive_int,
        "Most records one consumer poll hands to the agents; small batches let due retries through a flood of input.",
    )
    fetch_max_wait_ms: int = setting(
        "DLQ_FETCH_MAX_WAIT",
        "50ms",
        parse_duration_ms,
        "Longest the consumer's fetch waits at the broker for new records. A due retry written while a fetch that "
        "does not include its partition is waiting is read only after that fetch returns "
        "(Faust fixes this wait at 1.5 s). After 20 empty fetches in a row the wait is 500 ms until records come.",
    )
    processing_guarantee: str = setting(
        "DLQ_PROCESSING_GUARANTEE",
        "exactly_once",
        _choice("at_least_once", "exactly_once"),
        "`exactly_once`: every output of a partition's stream steps (results, dead letters, retries, state) is "
        "written in one Kafka transaction per DLQ_COMMIT_INTERVAL, so a `read_committed` consumer of `results` and "
        "`dlq` sees exactly one outcome per request; `at_least_once`: outcomes are confirmed one by one, and a crash "
        "can repeat one.",
    )
    commit_interval_ms: int = setting(
        "DLQ_COMMIT_INTERVAL",
        "100ms",
        _positive_duration,
        "Under `exactly_once`: how often each partition's transaction commits (a step is acked once its transaction "
        "has committed).",
    )
    transaction_timeout_ms: int = setting(
        "DLQ_TRANSACTION_TIMEOUT",
        "10s",
        _positive_duration,
        "Under `exactly_once`: the broker aborts a transaction left open this long (a frozen worker's); a commit "
        "that takes longer restarts the worker in place (its tables rebuilt from the changelogs).",
    )
    drain_timeout_ms: int = setting(
        "DLQ_DRAIN_TIMEOUT",
        "5s",
        parse_duration_ms,
        "On shutdown or a rebalance, how long calls in flight may finish; the rest are left unacked for the "
        "partition's next owner, and requests only waiting to be called (held by the breaker, waiting for a slot) "
        "at once.",
    )
    poison_after_crashes: int = setting(
        "DLQ_POISON_AFTER_CRASHES",
        "3",
        _positive_int,
        "A message the worker died on (in progress at this many unclean stops in a row) is dead-lettered as `poison` "
        "instead of being handled again.",
    )
    timer_interval_ms: int = setting(
        "DLQ_TIMER_INTERVAL", "20ms", parse_duration_ms, "How often the retry timer scans for due retries."
    )
    due_lead_max_ms: int = setting(
        "DLQ_DUE_LEAD_MAX",
        "1s",
        parse_duration_ms,
        "The retry timer hands a retry to the due agent ahead of its due time: 1.5 x the slowest hand-over of the "
        "last 30-60 s, at least 500 ms, at most this long; the attempt itself never starts before the due time. "
        "0: hand retries over when due.",
    )
    timer_batch: int = setting(
        "DLQ_TIMER_BATCH", "500", _positive_int, "Most due retries the timer hands over per partition per tick."
    )
