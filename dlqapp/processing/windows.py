"""The worker's in-flight windows and feeds, created and released together, and the door
every agent's events come through."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dlqapp.flowcontrol.input_gate import InputGate
from dlqapp.kafka.acks import Acks, Ticket
from dlqapp.processing.crashguard import CrashGuard
from dlqapp.processing.feed import GatedFeed
from dlqapp.processing.flow import InFlightWindow, OnDone, OnPoison
from dlqapp.tables.progress import Progress
from dlqapp.tables.steps import StreamSteps


class InFlightWindows:
    """The worker's in-flight windows, created and released together, and the door every
    agent's events come through (`admit`)."""

    def __init__(
        self,
        limit: int,
        drain_timeout_s: float,
        *,
        steps: StreamSteps,
        acks: Acks,
        progress: Progress | None,
        guard: CrashGuard | None,
    ) -> None:
        self.limit = limit
        self.drain_timeout_s = drain_timeout_s
        self.steps = steps
        self.acks = acks
        self.progress = progress
        self.guard = guard
        self._windows: list[InFlightWindow] = []
        self._feeds: list[GatedFeed] = []
        self._halted = False

    def admit(self, event: object) -> Ticket | None:
        """The door: track `event` for its ack; None when it is not to be handled: its outputs
        are already committed (exactly_once: below its topic's progress), acked without being
        handled again, or it was read ahead of its turn (it ends with that read's step)."""
        ticket = self.acks.track(event)
        if ticket.follows is not None:
            return None
        if self.progress is not None:
            topic, partition = ticket.topic_partition
            if self.progress.already_done(topic, partition, ticket.offset):
                self.acks.ended(ticket, None)
                return None
            ticket.strikes = self.progress.strikes(topic, partition, ticket.offset)
        return ticket

    def admit_ahead(self, event: object, topic: str, partition: int, offset: int) -> Ticket | None:
        """A record read ahead of its turn (dlqapp.kafka.tail_read): its ticket, or None when it
        may not run now (the door has reached it, or a previous owner's outputs hold it)."""
        if self.progress is not None and (
            self.progress.already_done(topic, partition, offset) or self.progress.strikes(topic, partition, offset)
        ):
            return None
        return self.acks.track_ahead(event, (topic, partition), offset)

    def new(
        self,
        on_poison: OnPoison,
        on_stop: Callable[[BaseException], None],
        *,
        limit: int | None = None,
        on_done: OnDone | None = None,
    ) -> InFlightWindow:
        """A window of `limit` steps (default: the windows' limit)."""
        window = InFlightWindow(
            limit or self.limit,
            steps=self.steps,
            acks=self.acks,
            on_poison=on_poison,
            on_stop=on_stop,
            guard=self.guard,
            on_done=on_done,
            progress=self.progress,
        )
        self._windows.append(window)
        return window

    def feed(
        self,
        window: InFlightWindow,
        gate: InputGate,
        *,
        closed_limit: int,
        read_ahead: int | None = None,
        read_ahead_bytes: int | None = None,
        weight_of: Callable[[str], float] = lambda tenant: 1.0,
    ) -> GatedFeed:
        """A gated, fair feed into `window`, released with it (see GatedFeed); `read_ahead`:
        the events it may hold while the window is full (default: the window's limit), and
        `read_ahead_bytes` the memory they may hold (default: no bound but their count)."""
        feed = GatedFeed(
            window,
            gate,
            open_limit=max(read_ahead or self.limit, self.limit),
            closed_limit=closed_limit,
            window_limit=self.limit,
            open_bytes=read_ahead_bytes,
            weight_of=weight_of,
        )
        self._feeds.append(feed)
        return feed

    @property
    def in_flight(self) -> int:
        return sum(window.in_flight for window in self._windows)

    async def release(self) -> int:
        """Hand back what every window and feed holds (see InFlightWindow.release); they
        stay closed until `reopen`.

        The windows together, within one grace period (DLQ_DRAIN_TIMEOUT): one after another,
        each with its own, a stop with steps held on two of them (by an open breaker) took
        twice as long and overran the stop's bound. The feeds last: their agents may take
        events while the windows give running steps their grace period, and those belong to
        the assignment being revoked."""
        released = sum(await asyncio.gather(*(window.release(self.drain_timeout_s) for window in self._windows)))
        released += sum(feed.release() for feed in self._feeds)
        return released + self.acks.hand_back_running()

    def halt(self) -> None:
        """The worker is about to restart or stop: no step starts any more, for good (a call
        made now would be paid for and made again after the restart). Running steps go on."""
        self._halted = True
        for window in self._windows:
            window.close()

    def reopen(self) -> None:
        """A new assignment has begun: the door forgets the old one, the windows take events
        again (unless the worker was halted)."""
        self.acks.reset()
        if self.progress is not None:
            self.progress.reset()
        if self._halted:
            return
        for window in self._windows:
            window.reopen()
