"""An idle consumer's fetches wait longer at the broker; the first fetch with records ends it."""

import asyncio

from dlqapp.kafka.idle_fetch import EMPTY_FETCHES_TO_IDLE, IDLE_FETCH_WAIT_MS, install


class ScriptedFetcher:
    """aiokafka's Fetcher as far as the wait goes: each fetch brings what the script says."""

    def __init__(self, script: list[bool], wait_ms: int = 50) -> None:
        self._fetch_max_wait_ms = wait_ms  # DLQ_FETCH_MAX_WAIT, set by the consumer thread
        self.script = iter(script)
        self.waits: list[int] = []

    async def _proc_fetch_request(self, assignment, node_id, request) -> bool:
        self.waits.append(self._fetch_max_wait_ms)  # the wait this fetch was sent with
        return next(self.script)


def run(fetcher: ScriptedFetcher, fetches: int) -> None:
    async def go():
        for _ in range(fetches):
            await fetcher._proc_fetch_request(None, 0, None)

    asyncio.run(go())


def test_the_wait_grows_only_after_enough_empty_fetches_in_a_row_and_shrinks_at_the_first_records():
    empties = EMPTY_FETCHES_TO_IDLE
    script = [False] * (empties - 1) + [True] + [False] * empties + [False, True, False]
    fetcher = ScriptedFetcher(script)
    wait = install(fetcher, busy_ms=50)
    run(fetcher, len(script))
    idle = IDLE_FETCH_WAIT_MS
    # one short of idle, then records: the count starts again
    assert fetcher.waits[: 2 * empties] == [50] * (2 * empties)
    assert fetcher.waits[2 * empties :] == [idle, idle, 50]  # idle after `empties` empty ones; records end it
    assert not wait.idle


def test_a_busy_wait_as_long_as_the_idle_one_never_shrinks():
    fetcher = ScriptedFetcher([False] * (EMPTY_FETCHES_TO_IDLE + 2), wait_ms=2000)
    install(fetcher, busy_ms=2000)
    run(fetcher, EMPTY_FETCHES_TO_IDLE + 2)
    assert set(fetcher.waits) == {2000}
