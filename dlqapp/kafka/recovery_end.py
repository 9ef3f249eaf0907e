"""Table recovery that ends on transactional changelogs (DLQ_PROCESSING_GUARANTEE=exactly_once).

Faust's recovery of a changelog partition waits until it has received the record at
"end offset - 1" (`Recovery._build_highwaters`, `active_offsets`). A transaction ends with
a commit marker in every partition it wrote, and a consumer never receives markers (nor,
reading committed records only, the records of an aborted transaction), so the last
offset is one the recovery never sees and it waits forever. Faust checks for this only in
its own exactly_once mode, and only after two idle polls of 5 s.

`finish_recovered(app)` is Faust's own remedy (`detect_aborted_tx`) applied at once: an
active changelog partition whose fetch position has reached its end offset, with nothing
left in the changelog queue, is recovered; when none needs more, recovery ends.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("dlqapp.kafka.recovery_end")


async def finish_recovered(app: Any) -> bool:
    """End a recovery that only markers or aborted records hold back; True when it ended it."""
    recovery = app.tables.recovery
    if not recovery.in_recovery or not app.tables.changelog_queue.empty():
        return False
    highwaters, offsets = recovery.active_highwaters, recovery.active_offsets
    waiting = [
        tp
        for tp, high in highwaters.items()
        if high is not None and high >= 0 and (offsets.get(tp) is None or offsets[tp] < high)
    ]
    if not waiting:
        return False
    for tp in waiting:
        position = await app.consumer.position(tp)
        if position is None or position <= highwaters[tp]:
            return False  # still records (or a marker) to fetch before the end offset
    if not app.tables.changelog_queue.empty() or not recovery.in_recovery:
        return False  # records fetched while the positions were read
    for tp in waiting:
        offsets[tp] = highwaters[tp]
    if recovery.need_recovery():
        return False
    recovery.flush_buffers()
    recovery._set_recovery_ended()
    recovery.signal_recovery_end.set()
    log.debug("recovery ended past transaction markers of %d changelog partitions", len(waiting))
    return True


RECOVERY_CHECK_S = 0.2


async def end_recoveries(app: Any) -> None:
    """For the life of the worker: `finish_recovered` every RECOVERY_CHECK_S (app services
    start only after the first recovery, which this must end)."""
    while not app.should_stop:
        await asyncio.sleep(RECOVERY_CHECK_S)
        try:
            await finish_recovered(app)
        except Exception as exc:  # mid-rebalance (no consumer position yet): the next look
            log.debug("recovery end not checked: %r", exc)
