"""The one ack rule: an event is acked only after its step committed and every earlier event of its
partition was acked. Every agent acks through here.

Each consumed event gets a `Ticket` at the agent's door, in delivery order per topic
partition. When its step ends, the ticket is `ended` with what resolves at the step's commit
(None: nothing to wait for); it is acked once that resolved and every earlier ticket of its
topic partition was acked. Faust therefore only ever sees a contiguous run of acked offsets
(its out-of-order commit bug, faust #606, cannot fire), and an offset is committed only after
the outputs of every event before it are.

An event handed back (a rebalance, a stop) is never acked, so neither is anything after it
on its topic partition: those events are handed back to the consumer as they end.

`progress(partition)` says, per topic, which events have ended: every offset below `next`,
and the offset ranges `also` beyond it (events that ended while an earlier one still ran,
or after one handed back). Under exactly_once each transaction is sealed with it
(dlqapp.tables.progress), so a new owner skips the events whose outputs committed but whose
offsets Faust had not committed yet.

A record read ahead of its turn (dlqapp.kafka.tail_read: the end of a partition read while
the consumer is far behind) gets a ticket `ahead` of the line (`track_ahead`), only for an
offset the door has not reached. It is never acked itself: once it ended, its offset is
among the line's `also`, and when the consumer's own event at that offset comes through the
door, that event's ticket `follows` it and ends with it (its step is not run twice).
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class TicketState(enum.Enum):
    RUNNING = "running"
    ENDED = "ended"
    """Its step ended; its outputs are in a transaction (or it sent none): waiting for the commit."""
    DONE = "done"
    """Committed (or nothing to commit): acked once every earlier ticket is."""
    HANDED_BACK = "handed_back"


Ranges = tuple[tuple[int, int], ...]
"""Inclusive offset ranges, ascending."""


@dataclass(frozen=True)
class Ended:
    """Which events of one topic partition have ended: all below `next`, and those in `also`."""

    next: int
    also: Ranges = ()

    def covers(self, offset: int) -> bool:
        return offset < self.next or any(low <= offset <= high for low, high in self.also)


@dataclass
class _Line:
    """The tickets of one topic partition not yet acked, in delivery order."""

    tickets: deque[Ticket] = field(default_factory=deque)
    run: int = 0
    """How many tickets from the head have ended (or are done)."""
    next: int = 0
    """The offset after the last ticket of the run (the first one's while none ended)."""
    ahead: set[int] = field(default_factory=set)
    """Offsets of tickets that ended beyond the run."""
    door: int = 0
    """The offset after the last event that came through the door."""
    claimed: dict[int, Ticket] = field(default_factory=dict)
    """Tickets read ahead of their turn, by offset, whose event has not come through the door yet."""
    blocked: bool = False
    """A ticket was handed back: nothing of this line is acked any more."""
    stale: bool = False
    """Its assignment is over: its tickets are neither acked nor counted."""


class Ticket:
    """One consumed event, from the door to its ack."""

    __slots__ = (
        "ahead",
        "committed",
        "event",
        "follower",
        "follows",
        "line",
        "offset",
        "state",
        "strikes",
        "topic_partition",
    )

    def __init__(
        self, event: Any, topic_partition: tuple[str, int], offset: int, *, line: _Line, ahead: bool = False
    ) -> None:
        self.event = event
        self.line = line
        """Its topic partition's line in the assignment it was delivered in."""
        self.topic_partition = topic_partition
        self.offset = offset
        self.state = TicketState.RUNNING
        self.strikes = 0
        """How many transactions this record broke already (dlqapp.tables.progress)."""
        self.ahead = ahead
        """Read ahead of its turn (module doc): never acked, never handed back to the consumer."""
        self.committed: asyncio.Future[None] | None = None
        """An ahead ticket's: what resolves at the commit of its step's outputs, once it ended."""
        self.follower: Ticket | None = None
        """An ahead ticket's: the consumer's ticket at the same offset, once it came through the door."""
        self.follows: Ticket | None = None
        """The ahead ticket this one ends with (its event was handled ahead of its turn)."""

    @property
    def partition(self) -> int:
        return self.topic_partition[1]

    @property
    def position(self) -> tuple[str, int, int]:
        return (self.topic_partition[0], self.topic_partition[1], self.offset)


class Acks:
    """Acks every agent's events by the one rule (module doc)."""

    def __init__(self, hand_back: Callable[[Any], None]) -> None:
        """`hand_back(event)` gives an event back to the consumer unacked (its offset never committed)."""
        self._hand_back = hand_back
        self._lines: dict[tuple[str, int], _Line] = {}

    def track(self, event: Any) -> Ticket:
        """The door: `event` was handed to an agent (call in delivery order). When it was read
        ahead of its turn, the ticket `follows` that read's and must not be handled again."""
        message = event.message
        topic_partition = (message.topic, message.partition)
        line = self._lines.get(topic_partition)
        if line is None:
            # delivery starts at the committed offset: everything before it is done
            line = self._lines[topic_partition] = _Line(next=message.offset)
        ticket = Ticket(event, topic_partition, message.offset, line=line)
        line.tickets.append(ticket)
        line.door = max(line.door, message.offset + 1)
        ahead = line.claimed.pop(message.offset, None)
        if ahead is not None:  # running or ended: a handed-back one is no longer claimed
            ticket.follows = ahead
            if ahead.state is TicketState.RUNNING:
                ahead.follower = ticket
            else:
                self.ended(ticket, ahead.committed)
        return ticket

    def expected(self, topic_partition: tuple[str, int]) -> int | None:
        """The offset the door expects next on `topic_partition` (None: none came through it yet)."""
        line = self._lines.get(topic_partition)
        return None if line is None else line.door

    def track_ahead(self, event: Any, topic_partition: tuple[str, int], offset: int) -> Ticket | None:
        """A record read ahead of its turn (module doc); None when it may not be: the door has
        reached it, no event of its partition came through the door yet, or the line is blocked."""
        line = self._lines.get(topic_partition)
        if line is None or line.blocked or offset < line.door or offset in line.claimed:
            return None
        ticket = line.claimed[offset] = Ticket(event, topic_partition, offset, line=line, ahead=True)
        return ticket

    def ended(self, ticket: Ticket, committed: asyncio.Future[None] | None) -> None:
        """Its step ended: ack it once `committed` resolved (at once when None; never when it fails)."""
        if ticket.state is not TicketState.RUNNING:
            return
        if ticket.ahead:
            self._ahead_ended(ticket, committed)
            return
        ticket.state = TicketState.ENDED
        if not ticket.line.stale:
            self._advance(ticket.line, ticket)
        if committed is None:
            self._done(ticket)
        else:
            committed.add_done_callback(lambda done: self._on_commit(ticket, done))

    def hand_back(self, ticket: Ticket) -> None:
        """Give the event back unacked; nothing after it on its topic partition is acked any more.
        An event whose step ended is left alone: it is handed back when it is done."""
        if ticket.state is not TicketState.RUNNING:
            return
        ticket.state = TicketState.HANDED_BACK
        if ticket.ahead:  # not the consumer's event: its own comes through the door, or goes back
            if ticket.line.claimed.get(ticket.offset) is ticket:
                del ticket.line.claimed[ticket.offset]
            if ticket.follower is not None:
                self.hand_back(ticket.follower)
            return
        self._hand_back(ticket.event)
        line = ticket.line
        if not line.stale and not line.blocked:
            line.blocked = True
            for later in line.tickets:
                if later.state is TicketState.DONE:
                    self._hand_back(later.event)

    def progress(self, partition: int) -> dict[str, Ended]:
        """Topic → which events of its `partition` have ended (module doc)."""
        return {
            topic: Ended(line.next, _ranges(line.ahead)) for (topic, p), line in self._lines.items() if p == partition
        }

    def pending(self) -> int:
        """Events tracked and neither acked nor handed back."""
        return sum(
            1 for line in self._lines.values() for ticket in line.tickets if ticket.state is not TicketState.HANDED_BACK
        )

    def hand_back_running(self) -> int:
        """Give back every event whose step has not ended (a rebalance, a stop). Returns how many."""
        running = [t for line in self._lines.values() for t in line.tickets if t.state is TicketState.RUNNING]
        for ticket in running:
            self.hand_back(ticket)
        return len(running)

    def reset(self) -> None:
        """A new assignment: forget every partition (what was not acked is delivered again)."""
        for line in self._lines.values():
            line.stale = True
        self._lines.clear()

    def _ahead_ended(self, ticket: Ticket, committed: asyncio.Future[None] | None) -> None:
        """An ahead ticket's step ended: its offset joins the line's `also`, and the consumer's
        ticket at that offset, if it came already, ends with it."""
        ticket.state = TicketState.ENDED
        ticket.committed = committed
        line = ticket.line
        if not line.stale and ticket.offset >= line.next:
            line.ahead.add(ticket.offset)
        if ticket.follower is not None:
            self.ended(ticket.follower, committed)

    def _on_commit(self, ticket: Ticket, committed: asyncio.Future[None]) -> None:
        if committed.cancelled() or committed.exception() is not None:
            return  # the transaction failed: the worker restarts, the event is redelivered
        self._done(ticket)

    def _done(self, ticket: Ticket) -> None:
        if ticket.state is not TicketState.ENDED:
            return
        ticket.state = TicketState.DONE
        line = ticket.line
        if line.stale:
            return  # an assignment ago
        if line.blocked:
            self._hand_back(ticket.event)
            return
        while line.tickets and line.tickets[0].state is TicketState.DONE:
            line.tickets.popleft().event.ack()
            line.run -= 1

    @staticmethod
    def _advance(line: _Line, ticket: Ticket) -> None:
        tickets = line.tickets
        if line.run >= len(tickets) or tickets[line.run] is not ticket:
            line.ahead.add(ticket.offset)  # an earlier one still runs (or was handed back)
            return
        while line.run < len(tickets) and tickets[line.run].state in (TicketState.ENDED, TicketState.DONE):
            offset = tickets[line.run].offset
            line.ahead.discard(offset)
            line.next = offset + 1
            line.run += 1


def _ranges(offsets: set[int]) -> Ranges:
    ranges: list[tuple[int, int]] = []
    for offset in sorted(offsets):
        if ranges and offset == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], offset)
        else:
            ranges.append((offset, offset))
    return tuple(ranges)
