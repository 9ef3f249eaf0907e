"""The crash-loop guard across simulated deaths: a new CrashGuard on the same journal is a restart."""

import asyncio
import json
import threading

from dlqapp.processing.crashguard import CrashGuard

P = ("input", 1, 42)
INNOCENT = ("input", 1, 43)  # read after P: careful after an unclean stop too


def die_while_handling(path, position, after=3):
    """One run of a worker that dies (no close) while `position` runs in careful mode."""
    guard = CrashGuard(str(path), after)
    guard.open()

    async def run():
        if guard.is_poison(position):
            return "poison"
        first = guard.seen(position)
        if first is not None:
            await asyncio.wrap_future(first)
        if guard.needs_care(position):
            async with guard.careful(position):
                return "died"  # the process ends here: the context never exits in real life
        guard.snapshot()
        return "died"

    outcome = asyncio.run(_hold(guard, position, run))
    return guard, outcome


async def _hold(guard, position, run):
    result = await run()
    guard.flush()
    if result == "died" and guard.needs_care(position):
        guard._current = position  # still named: the death happened inside the block
        guard._write(clean=False)
    return result


def test_a_message_that_kills_the_worker_three_times_in_a_row_becomes_poison(tmp_path):
    journal = tmp_path / "in-progress.json"
    outcomes = [die_while_handling(journal, P)[1] for _ in range(5)]
    # run 1 dies outside careful mode (no journal yet), runs 2-4 die naming P, run 5 refuses it
    assert outcomes == ["died", "died", "died", "died", "poison"]


def test_a_clean_stop_forgets_everything(tmp_path):
    journal = tmp_path / "in-progress.json"
    die_while_handling(journal, P)
    die_while_handling(journal, P)
    guard = CrashGuard(str(journal), 3)
    guard.open()
    assert guard.needs_care(P) and guard.crashes(P) == 1
    guard.close()
    after = CrashGuard(str(journal), 3)
    after.open()
    assert not after.needs_care(P) and after.crashes(P) == 0


def test_crashes_count_only_when_in_a_row_on_the_same_message(tmp_path):
    journal = tmp_path / "in-progress.json"
    die_while_handling(journal, P)
    die_while_handling(journal, P)
    die_while_handling(journal, INNOCENT)  # a different message this time
    guard = CrashGuard(str(journal), 3)
    guard.open()
    assert guard.crashes(INNOCENT) == 1 and guard.crashes(P) == 0


def test_careful_mode_runs_messages_one_at_a_time():
    async def run(tmp):
        guard = CrashGuard(str(tmp), 3)
        guard._careful_until = {"input:1": 100}
        order = []

        async def handle(offset):
            async with guard.careful(("input", 1, offset)):
                order.append(("start", offset))
                await asyncio.sleep(0.01)
                order.append(("end", offset))

        await asyncio.gather(handle(1), handle(2))
        guard.flush()  # the journal's last writes land before its directory goes
        return order

    import os
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        order = asyncio.run(run(os.path.join(d, "j.json")))
    assert order == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]


def test_the_careful_margin_grows_only_for_quick_deaths(tmp_path):
    import json as _json

    journal = tmp_path / "in-progress.json"
    for quick in (True, True, False):
        guard = CrashGuard(str(journal), 3)
        guard.open()
        guard.seen(P)
        guard.snapshot()
        guard.flush()
        state = _json.loads(journal.read_text())
        if not quick:  # lived long after its first message (a kill -9 in the middle of a run)
            state["first_handled_at"] -= 60_000
            journal.write_text(_json.dumps(state))
    guard = CrashGuard(str(journal), 3)
    guard.open()
    assert guard._margin == 128  # reset by the long run


def test_after_an_unclean_stop_only_what_was_being_handled_and_what_came_after_need_care(tmp_path):
    """The input feed hands events over out of offset order (each tenant in its turn): a
    message handled and done before the stop, below the highest offset, runs normally, or a
    read-ahead of thousands would be handled one at a time after every kill."""
    journal = tmp_path / "in-progress.json"
    guard = CrashGuard(str(journal), 3)
    guard.open()
    for offset in (10, 500, 9000):
        guard.seen(("input", 1, offset))
    guard.finished(("input", 1, 10))
    guard.finished(("input", 1, 9000))
    guard.snapshot()
    guard.flush()  # then the process dies
    after = CrashGuard(str(journal), 3)
    after.open()
    assert after.needs_care(("input", 1, 500))  # it was running
    assert not after.needs_care(("input", 1, 10)) and not after.needs_care(("input", 1, 4000))
    assert after.needs_care(("input", 1, 9001))  # may have started after the last snapshot


def _held_journal(guard, monkeypatch):
    """Make the guard's journal writes wait until the returned event is set; returns
    (held: set while a write waits, release, states written)."""
    held, release, written = threading.Event(), threading.Event(), []
    store = guard._store

    def slow_store(state):
        held.set()
        release.wait(10)
        written.append(state)
        store(state)

    monkeypatch.setattr(guard, "_store", slow_store)
    return held, release, written


def _held_guard(tmp_path, monkeypatch):
    """A started guard on a journal in `tmp_path` whose writes are held (`_held_journal`)."""
    journal = tmp_path / "in-progress.json"
    guard = CrashGuard(str(journal), 3)
    guard.open()
    return journal, guard, _held_journal(guard, monkeypatch)


def test_a_partitions_first_message_waits_for_its_journal_write_and_the_event_loop_does_not(tmp_path, monkeypatch):
    journal, guard, (held, release, written) = _held_guard(tmp_path, monkeypatch)

    async def run():
        first = guard.seen(P)
        assert first is not None and guard.seen(INNOCENT) is first  # the partition's next ones wait for it too
        other = guard.seen(("input", 2, 7))  # another partition: a write of its own
        assert other is not None and other is not first
        while not held.is_set():
            await asyncio.sleep(0)
        turns = 0
        for _ in range(50):  # the loop goes on while the journal's thread is held
            await asyncio.sleep(0)
            turns += 1
        assert turns == 50 and not first.done()
        release.set()
        await asyncio.wrap_future(first)
        assert written[0]["highs"] == {"input:1": 42}  # 43 lies within the careful margin
        await asyncio.wrap_future(other)
        assert guard.seen(("input", 1, 44)) is None  # written: nothing to wait for
        return json.loads(journal.read_text())

    state = asyncio.run(run())
    assert state["highs"] == {"input:1": 43, "input:2": 7} and state["clean"] is False


def test_snapshots_do_not_pile_up_behind_a_slow_write_and_a_clean_stop_lands_last(tmp_path, monkeypatch):
    journal, guard, (held, release, written) = _held_guard(tmp_path, monkeypatch)
    guard.seen(P)
    assert held.wait(5)  # the first message's write, held
    guard.snapshot()  # returns at once, queued behind it
    guard.snapshot()  # skipped: two are under way
    threading.Timer(0.05, release.set).start()
    guard.close()  # waits for the queued writes, then writes the clean stop
    assert [state["clean"] for state in written] == [False, False, True]
    assert json.loads(journal.read_text())["clean"] is True


def test_a_journal_that_cannot_be_written_never_fails_a_message(tmp_path, monkeypatch, caplog):
    guard = CrashGuard(str(tmp_path / "in-progress.json"), 3)
    guard.open()

    def full_disk(state):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(guard, "_store", full_disk)

    async def run():
        await asyncio.wrap_future(guard.seen(P))  # completes: the message goes on
        async with guard.careful(INNOCENT):
            return "handled"

    assert asyncio.run(run()) == "handled"
    guard.flush()
    assert any("crash_journal_not_written" in r.getMessage() for r in caplog.records)


def test_a_cancelled_wait_never_cancels_the_write_others_wait_for(tmp_path, monkeypatch):
    from dlqapp.processing.crashguard import wait_written

    journal, guard, (held, release, written) = _held_guard(tmp_path, monkeypatch)

    async def run():
        guard.snapshot()  # held on the journal's thread
        while not held.is_set():
            await asyncio.sleep(0)
        first = guard.seen(P)  # queued behind it
        cancelled = asyncio.ensure_future(wait_written(first))
        other = asyncio.ensure_future(wait_written(guard.seen(INNOCENT)))
        await asyncio.sleep(0)
        cancelled.cancel()  # a step released (rebalance) while it waited
        release.set()
        await other  # not cancelled with it
        return cancelled.cancelled()

    assert asyncio.run(run())
    guard.flush()
    assert written[-1]["highs"] == {"input:1": 42}  # the write happened all the same
    guard.close()
    assert json.loads(journal.read_text())["clean"] is True


def test_the_careful_time_limit_starts_once_the_message_is_named(tmp_path, monkeypatch):
    from dlqapp.processing import crashguard

    monkeypatch.setattr(crashguard, "CAREFUL_TIMEOUT_S", 0.05)
    _, guard, (held, release, _) = _held_guard(tmp_path, monkeypatch)
    order = []

    async def handle(offset):
        async with guard.careful(("input", 1, offset)):
            order.append(("start", offset))
            await asyncio.sleep(0.01)
            order.append(("end", offset))

    async def run():
        first = asyncio.ensure_future(handle(1))
        while not held.is_set():
            await asyncio.sleep(0)
        second = asyncio.ensure_future(handle(2))
        await asyncio.sleep(0.2)  # a disk slower than the careful time limit
        release.set()
        await asyncio.gather(first, second)

    asyncio.run(run())
    guard.flush()
    assert order == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]
