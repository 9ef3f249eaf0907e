"""Background work that lives as long as the worker: Faust (mode) services.

Each starts after table recovery and stops with the app: the retry timer (and its due-hop
producer), the retention sweep, the crash-loop guard's journal, the alert webhook, the
event-loop lag gauge; under exactly_once, the transaction commits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from mode import Service

from dlqapp.core.clock import Clock
from dlqapp.deadletters.alerts import AlertBatcher
from dlqapp.flowcontrol.input_gate import InputGate
from dlqapp.kafka.changelog_follower import ChangelogFollower
from dlqapp.kafka.faust_consumer_state import set_topic_paused
from dlqapp.observability import metrics
from dlqapp.observability.tracing import Tracing
from dlqapp.processing.crashguard import CrashGuard
from dlqapp.retries.scheduler import RetryScheduler
from dlqapp.tables.retention import Sweeper
from dlqapp.tables.spend_view import SpendView
from dlqapp.tables.steps import StreamSteps

log = logging.getLogger("dlqapp.wiring.services")

SWEEP_INTERVAL_S = 1.0
ERROR_LOG_INTERVAL_S = 60.0
JOURNAL_INTERVAL_S = 1.0
MIN_TIMER_SLEEP_S = 0.001


class _Loop(Service):
    """A service that runs `tick()` every `interval_s`, skipping rebalances."""

    interval_s: float = 1.0

    def __init__(self, app: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.app = app

    async def tick(self) -> None:
        raise NotImplementedError

    def next_sleep_s(self) -> float:
        """How long to sleep before the next tick."""
        return self.interval_s

    def on_rebalancing(self) -> None:
        """Called instead of `tick` while partitions move."""

    @Service.task
    async def _run(self) -> None:
        last_logged = float("-inf")
        while not self.should_stop:
            await self.sleep(self.next_sleep_s())
            if self.app.should_stop:  # the tables may be closed already
                return
            if self.app.rebalancing or self.app.in_recovery:
                self.on_rebalancing()
                continue
            try:
                await self.tick()
            except Exception:  # a failed tick must not stop the loop; the next one retries
                if time.monotonic() - last_logged >= ERROR_LOG_INTERVAL_S:  # at most one traceback a minute
                    log.exception("%s tick failed", type(self).__name__)
                    last_logged = time.monotonic()


class RetryTimer(_Loop):
    """Every DLQ_TIMER_INTERVAL, or sooner when the next parked retry is to be handed over,
    hand due retries (and those due within DLQ_DUE_LEAD_MAX's lead) to the due agent."""

    def __init__(self, app: Any, scheduler: RetryScheduler, interval_ms: int, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.scheduler = scheduler
        self.interval_s = interval_ms / 1000

    async def on_start(self) -> None:
        await self.scheduler.handover.start()

    async def on_stop(self) -> None:
        await self.scheduler.handover.stop()

    def on_rebalancing(self) -> None:
        self.scheduler.forget_handed_over()

    async def tick(self) -> None:
        await self.scheduler.hand_over_due()
        await self.scheduler.parked.recount_if_reassigned()

    def next_sleep_s(self) -> float:
        """Wake when the next parked retry is to be handed over, if that is before the next tick.

        With a lead of at least two ticks (DueLead) a retry is handed over well before its due
        time at any tick, so the timer just ticks: waking for every retry as it came within
        the lead cost a scan of every partition per retry (about 1 % of a core at 140 retries/s)."""
        next_fire = self.scheduler.next_hand_over_at
        if next_fire is None or self.scheduler.lead.ms >= 2 * self.interval_s * 1000:
            return self.interval_s
        until_due_s = (next_fire - self.scheduler.clock()) / 1000
        return min(self.interval_s, max(MIN_TIMER_SLEEP_S, until_due_s))


class RetentionSweep(_Loop):
    """Forget settled states and old ledgers after DLQ_STATE_RETENTION (dlqapp.tables.retention)."""

    interval_s = SWEEP_INTERVAL_S

    def __init__(self, app: Any, sweeper: Sweeper, clock: Clock, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.sweeper = sweeper
        self.clock = clock

    def on_rebalancing(self) -> None:
        self.sweeper.forget_cursors()

    async def tick(self) -> None:
        await self.sweeper.sweep(self.clock())


class InputPause(Service):
    """Pauses and resumes fetching of the input partitions as the input gate decides."""

    def __init__(self, app: Any, gate: InputGate, input_topic: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.app = app
        self.gate = gate
        self.input_topic = input_topic

    @Service.task
    async def _run(self) -> None:
        await self.gate.run(self._set_paused)

    async def _set_paused(self, paused: bool) -> None:
        try:
            await set_topic_paused(self.app, self.input_topic, paused)
        except Exception as exc:  # e.g. mid-rebalance: the gate tries again
            log.debug("input %s failed: %r", "pause" if paused else "resume", exc)
            raise


class LoopLag(Service):
    """Measures event-loop lag (`dlqapp_event_loop_lag_seconds`): how late a short sleep wakes up."""

    tick_s = 0.25
    window = 4

    @Service.task
    async def _run(self) -> None:
        worst: list[float] = []
        while not self.should_stop:
            started = time.monotonic()
            await asyncio.sleep(self.tick_s)
            worst.append(max(0.0, time.monotonic() - started - self.tick_s))
            if len(worst) >= self.window:
                metrics.loop_lag.set(max(worst))
                worst.clear()


class CrashJournal(Service):
    """Keeps the crash-loop guard's journal about a second behind (dlqapp.processing.crashguard)."""

    def __init__(self, guard: CrashGuard, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.guard = guard

    @Service.task
    async def _run(self) -> None:
        while not self.should_stop:
            await self.sleep(JOURNAL_INTERVAL_S)
            self.guard.snapshot()


class AlertWebhook(Service):
    """Posts batched dead-letter alerts (DLQ_ALERT_WEBHOOK_URL)."""

    def __init__(self, alerts: AlertBatcher, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.alerts = alerts

    @Service.task
    async def _run(self) -> None:
        await self.alerts.run(lambda: self.should_stop)


class TracingFlush(Service):
    """With tracing on: when the worker stops (a restart in place included, which skips the
    exit handlers), export the spans that have ended, waiting `timeout_s` at most."""

    def __init__(self, tracing: Tracing, timeout_s: float = 5.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tracing = tracing
        self.timeout_s = timeout_s

    async def on_stop(self) -> None:
        if not await asyncio.to_thread(self.tracing.flush, self.timeout_s):
            log.warning("tracing: spans still unexported after %.0f s at stop", self.timeout_s)


class TransactionCommits(Service):
    """Under exactly_once: commit each owned partition's transaction every DLQ_COMMIT_INTERVAL,
    rebalances included (the steps a rebalance drains wait for their commit); a failed
    commit stops the worker (`on_failure`)."""

    def __init__(
        self, steps: StreamSteps, interval_ms: int, on_failure: Callable[[BaseException], None], **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.steps = steps
        self.interval_s = interval_ms / 1000
        self.on_failure = on_failure

    @Service.task
    async def _run(self) -> None:
        while not self.should_stop:
            await self.sleep(self.interval_s)
            try:
                await self.steps.commit_all()
            except Exception as exc:
                self.on_failure(exc)
                return


class SpendFollower(Service):
    """Follows the stats changelog for the cluster's spend and the budgets set at run time
    (dlqapp.tables.spend_view); when a budget changes, the requests held here are looked at again."""

    def __init__(self, follower: ChangelogFollower, view: SpendView, scheduler: RetryScheduler, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.follower = follower
        self.view = view
        self.scheduler = scheduler
        self._releases: set[asyncio.Future[int]] = set()
        view.on_budget_change.append(self._budget_changed)

    def _budget_changed(self, key: str) -> None:
        if not self.view.ready.is_set():
            return  # still reading the changelog from its start: nothing changed since the hold
        task = asyncio.ensure_future(self.scheduler.release_held())
        self._releases.add(task)
        task.add_done_callback(self._released)

    def _released(self, task: asyncio.Future[int]) -> None:
        self._releases.discard(task)
        if task.cancelled():
            return
        if task.exception() is not None:
            log.warning("held requests not released after a budget change: %r", task.exception())
        elif task.result():
            log.info("a budget changed: %d held requests looked at again", task.result())

    @Service.task
    async def _follow(self) -> None:
        await self.follower.run(lambda: self.should_stop)
