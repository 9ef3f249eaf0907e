"""Table recovery that ends on transactional changelogs (DLQ_PROCESSING_GUARANTEE=exactly_once).

Faust's recovery of a changelog partition waits until it has received the record at
"end offset - 1" (`Recovery._build_highwaters`, `active_offsets`). A transaction ends with
a commit marker in every partition it wrote, and a consumer never receives markers (nor,
reading committed records only, the records of an aborted transaction), so the last
offset is one the recovery never sees and it waits forever. Faust checks for this only in
its own exactly_once mode, and only after two idle polls of 5 s.

`RecoveryEnd` is Faust's own remedy (`detect_aborted_tx`) applied without its 2 x 5 s wait:
an active changelog partition whose fetch position has passed its end offset, once every
record fetched before has been handed to the changelog queue and the queue is empty, is
recovered; when none needs more, recovery ends.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("dlqapp.kafka.faust_recovery")


class RecoveryEnd:
    """Ends a recovery that only markers or aborted records hold back, once nothing it fetched
    can still be on its way to the tables.

    A fetch moves the consumer's position before its records reach the changelog queue: the
    consumer hands them over one by one, with awaits between (Faust's own remedy waits two
    idle polls of 5 s for this). So once every waiting partition's position has passed its
    end offset, the recovery ends only after the consumer's delivery loop has begun a later
    batch than the one running then (`delivered_batches`), with the queue empty."""

    def __init__(self) -> None:
        self._batch_at_end: int | None = None
        """The delivery batch running when the positions were first seen past the end offsets."""

    async def check(self, app: Any) -> bool:
        """End the recovery if it may end now (module doc); True when it ended it."""
        recovery = app.tables.recovery
        waiting = self._waiting(recovery)
        if not recovery.in_recovery or not waiting:
            self._batch_at_end = None
            return False
        for tp in waiting:
            position = await app.consumer.position(tp)
            if position is None or position <= recovery.active_highwaters[tp]:
                self._batch_at_end = None
                return False  # still records (or a marker) to fetch before the end offset
        batch = delivered_batches(app.consumer)
        if self._batch_at_end is None or batch is None:
            self._batch_at_end = batch
            return False  # records fetched by now may still be on their way: look again
        if batch <= self._batch_at_end or not app.tables.changelog_queue.empty() or not recovery.in_recovery:
            return False
        self._batch_at_end = None
        offsets = recovery.active_offsets
        for tp in waiting:
            offsets[tp] = recovery.active_highwaters[tp]
        if recovery.need_recovery():
            return False
        recovery.flush_buffers()
        recovery._set_recovery_ended()
        recovery.signal_recovery_end.set()
        log.debug("recovery ended past transaction markers of %d changelog partitions", len(waiting))
        return True

    @staticmethod
    def _waiting(recovery: Any) -> list[Any]:
        highwaters, offsets = recovery.active_highwaters, recovery.active_offsets
        return [
            tp
            for tp, high in highwaters.items()
            if high is not None and high >= 0 and (offsets.get(tp) is None or offsets[tp] < high)
        ]


def delivered_batches(consumer: Any) -> int | None:
    """How many fetch batches dlqapp's consumer has begun handing over (dlqapp.kafka.faust_consumer)."""
    batch = getattr(consumer, "delivery_batch", None)
    return batch if isinstance(batch, int) else None


RECOVERY_CHECK_S = 0.2


async def end_recoveries(app: Any) -> None:
    """For the life of the worker: `RecoveryEnd.check` every RECOVERY_CHECK_S (app services
    start only after the first recovery, which this must end)."""
    end = RecoveryEnd()
    while not app.should_stop:
        await asyncio.sleep(RECOVERY_CHECK_S)
        try:
            await end.check(app)
        except Exception as exc:  # mid-rebalance (no consumer position yet): the next look
            log.debug("recovery end not checked: %r", exc)
