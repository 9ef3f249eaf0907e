"""A recovery that only transaction markers hold back ends, but never while records it fetched
are still on their way to the tables (dlqapp.kafka.faust_recovery)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from dlqapp.kafka.faust_recovery import RecoveryEnd


class FakeRecovery:
    def __init__(self) -> None:
        self.in_recovery = True
        self.active_highwaters = {"changelog-0": 10}
        self.active_offsets = {"changelog-0": 7}  # the last record applied; 8 and 9: data? markers?
        self.ended = False
        self.signal_recovery_end = asyncio.Event()

    def need_recovery(self) -> bool:
        return any(self.active_offsets[tp] < high for tp, high in self.active_highwaters.items())

    def flush_buffers(self) -> None:
        pass

    def _set_recovery_ended(self) -> None:
        self.ended = True
        self.in_recovery = False


def fake_app(position: int) -> SimpleNamespace:
    recovery = FakeRecovery()
    queue: asyncio.Queue = asyncio.Queue()

    async def position_of(tp):
        return consumer.at

    consumer = SimpleNamespace(at=position, delivery_batch=5, position=position_of)
    return SimpleNamespace(tables=SimpleNamespace(recovery=recovery, changelog_queue=queue), consumer=consumer)


def test_it_ends_once_a_later_batch_began_with_nothing_queued():
    async def run():
        app = fake_app(position=11)  # past the end offset: 10 is a commit marker
        end = RecoveryEnd()
        assert not await end.check(app)  # record 8 or 9 may be in the batch being handed over
        assert not await end.check(app) and not app.tables.recovery.ended  # same batch still
        app.consumer.delivery_batch = 6
        assert await end.check(app) and app.tables.recovery.ended

    asyncio.run(run())


def test_a_record_handed_over_in_that_batch_is_applied_before_it_ends():
    """The race Faust's 2 x 5 s wait exists for: the position passed the end while the last data
    record was still between the fetch and the changelog queue."""

    async def run():
        app = fake_app(position=11)
        end = RecoveryEnd()
        assert not await end.check(app)
        app.tables.changelog_queue.put_nowait("record 9")  # the batch hands it over now
        app.consumer.delivery_batch = 6
        assert not await end.check(app)  # queued: recovery applies it first
        app.tables.changelog_queue.get_nowait()
        app.tables.recovery.active_offsets["changelog-0"] = 9
        assert await end.check(app)

    asyncio.run(run())


def test_nothing_ends_while_the_position_is_before_the_end():
    async def run():
        app = fake_app(position=9)
        end = RecoveryEnd()
        for batch in range(6, 10):
            app.consumer.delivery_batch = batch
            assert not await end.check(app)

    asyncio.run(run())
