"""What the in-flight window's and the gated feed's tests share: events that record their
ack, the door they come through, and an error route that re-raises."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from dlqapp.kafka.acks import Acks
from dlqapp.processing.flow import InFlightWindow
from dlqapp.tables.counters import Counters
from dlqapp.tables.step import StepContext
from dlqapp.tables.steps import StreamSteps


class FakeEvent:
    def __init__(self, offset: int, acked: list[int], partition: int = 0, topic: str = "input") -> None:
        self.offset, self._acked = offset, acked
        self.message = SimpleNamespace(topic=topic, partition=partition, offset=offset)

    def ack(self) -> bool:
        self._acked.append(self.offset)
        return True


async def _reraise(ticket: Any, exc: BaseException) -> None:
    raise exc


async def _no_send(*args: Any) -> Any:
    raise AssertionError("these handlers send nothing")


class Harness:
    """Stream steps (at_least_once, nothing sent) and the one ack rule, as the agents use them."""

    def __init__(self) -> None:
        self.forgotten: list[int] = []
        self.context = StepContext()
        self.acks = Acks(lambda event: self.forgotten.append(event.offset))
        counters = Counters({}, self.context, read=lambda partition, key: None)
        self.steps = StreamSteps(self.context, transactions=None, send=_no_send, counters=counters)

    def window(
        self, limit: int, on_poison: Any = _reraise, on_stop: Any = lambda exc: None, **kwargs: Any
    ) -> InFlightWindow:
        return InFlightWindow(limit, steps=self.steps, acks=self.acks, on_poison=on_poison, on_stop=on_stop, **kwargs)

    async def submit(self, window: InFlightWindow, event: FakeEvent, handler: Any, **kwargs: Any) -> None:
        """Through the door (tracked for its ack, in delivery order) into `window`."""
        await window.submit(self.acks.track(event), handler, **kwargs)
