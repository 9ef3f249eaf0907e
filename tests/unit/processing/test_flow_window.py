"""The in-flight window: acks in offset order per partition, failures routed, bounded
handlers, and what a release (rebalance or shutdown) does with the events in it."""

import asyncio

from dlqapp.kafka.transaction_errors import NotOwned, TransactionFailed
from tests.unit.processing.flow_fakes import FakeEvent, Harness


def test_window_acks_each_partition_in_offset_order_even_when_handlers_finish_out_of_order():
    async def run():
        h = Harness()
        acked = []
        gates = {i: asyncio.Event() for i in range(5)}
        window = h.window(10)
        for i in range(5):

            async def handler(i=i):
                await gates[i].wait()

            await h.submit(window, FakeEvent(i, acked), handler)
        for i in (3, 1, 4):  # later offsets finish first: nothing may be acked yet
            gates[i].set()
        await asyncio.sleep(0.01)
        assert acked == []
        gates[0].set()
        await asyncio.sleep(0.01)
        assert acked == [0, 1]  # 2 is still running, so 3 and 4 must wait
        gates[2].set()
        await window.join()
        assert acked == [0, 1, 2, 3, 4]

    asyncio.run(run())


def test_a_failing_handler_is_routed_and_acked_and_the_partition_moves_on():
    async def run():
        h = Harness()
        acked, routed, fatal = [], [], []

        async def route(ticket, exc):
            routed.append((ticket.offset, str(exc)))

        window = h.window(10, on_poison=route, on_stop=fatal.append)

        async def boom():
            raise RuntimeError("bug")

        async def fine():
            return None

        await h.submit(window, FakeEvent(0, acked), boom)
        await h.submit(window, FakeEvent(1, acked), fine)
        await window.join()
        assert routed == [(0, "bug")] and acked == [0, 1] and fatal == []

    asyncio.run(run())


def test_when_routing_fails_too_the_event_is_never_acked_and_the_worker_stops():
    async def run():
        h = Harness()
        acked, fatal = [], []
        window = h.window(10, on_stop=fatal.append)

        async def boom():
            raise RuntimeError("broker gone")

        async def fine():
            return None

        await h.submit(window, FakeEvent(0, acked), boom)
        await h.submit(window, FakeEvent(1, acked), fine)
        await window.join()
        assert acked == [] and isinstance(fatal[0], RuntimeError)

    asyncio.run(run())


def test_an_output_for_a_partition_handed_back_gives_its_event_back_and_the_worker_goes_on():
    async def run():
        h = Harness()
        acked, forgotten, fatal = [], h.forgotten, []
        window = h.window(10, on_stop=fatal.append)

        async def late():
            raise NotOwned("partition 0 was handed back")

        await h.submit(window, FakeEvent(0, acked), late)
        await window.join()
        assert forgotten == [0] and acked == [] and fatal == []

    asyncio.run(run())


def test_a_failed_transaction_stops_the_worker_once_per_step_without_acking(caplog):
    async def run():
        h = Harness()
        acked, fatal = [], []
        window = h.window(10, on_stop=fatal.append)

        async def committed_never():
            raise TransactionFailed("partition 0: transaction not committed")

        await h.submit(window, FakeEvent(0, acked), committed_never)
        await window.join()
        assert acked == [] and [type(exc) for exc in fatal] == [TransactionFailed]

    asyncio.run(run())
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # the restart says it, once


def test_release_lets_quick_handlers_finish_cancels_held_ones_and_hands_back_the_unacked():
    async def run():
        h = Harness()
        acked, forgotten = [], h.forgotten
        window = h.window(10)
        held = asyncio.Event()  # never set: a request held by an open breaker
        cancelled = []

        async def quick():
            await asyncio.sleep(0.01)

        async def stuck():
            try:
                await held.wait()
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        await h.submit(window, FakeEvent(0, acked), quick)
        await h.submit(window, FakeEvent(1, acked), stuck)
        await h.submit(window, FakeEvent(2, acked), quick)
        await h.submit(window, FakeEvent(10, acked, partition=1), quick)
        released = await asyncio.wait_for(window.release(grace_s=0.5), 5)
        assert acked == [0, 10]  # done and at the head of their partitions
        assert cancelled == [True]
        assert sorted(forgotten) == [1, 2] and released == 1  # 1 cancelled; 2 finished behind it: not acked either
        assert window.in_flight == 0
        window.reopen()  # the next assignment
        h.acks.reset()
        await h.submit(window, FakeEvent(3, acked), quick)
        await window.join()
        assert acked == [0, 10, 3]

    asyncio.run(run())


def test_events_taken_between_a_release_and_the_next_assignment_are_handed_back_not_started():
    """Between a rebalance's release and the next assignment, agents still take events of
    the assignment being revoked (from their queues, or a due hint the timer fired): none
    may start, or it runs for a partition another worker now owns and Faust's wait for
    acks hangs the rebalance until it ends."""

    async def run():
        h = Harness()
        acked, forgotten, handled = [], h.forgotten, []
        window = h.window(4)

        async def handle(offset):
            handled.append(offset)

        await window.release(grace_s=0.05)
        await h.submit(window, FakeEvent(5, acked), lambda: handle(5))
        assert window.in_flight == 0 and forgotten == [5] and not window.accepting
        window.reopen()
        h.acks.reset()
        await h.submit(window, FakeEvent(6, acked), lambda: handle(6))
        await window.join()
        assert handled == [6] and acked == [6] and forgotten == [5]

    asyncio.run(run())


def test_window_bounds_in_flight_handlers():
    async def run():
        h = Harness()
        window = h.window(2)
        gate = asyncio.Event()
        acked = []
        for i in range(2):
            await h.submit(window, FakeEvent(i, acked), gate.wait)
        third = asyncio.create_task(h.submit(window, FakeEvent(2, acked), gate.wait))
        await asyncio.sleep(0.01)
        assert not third.done()
        gate.set()
        await third
        await window.join()
        assert acked == [0, 1, 2]

    asyncio.run(run())


def test_an_event_submitted_during_or_after_a_release_is_given_back_at_once():
    async def run():
        h = Harness()
        acked, forgotten = [], h.forgotten
        window = h.window(1)
        gate = asyncio.Event()

        async def blocked():
            await gate.wait()

        async def quick():
            return None

        await h.submit(window, FakeEvent(0, acked), blocked)
        waiting = asyncio.create_task(h.submit(window, FakeEvent(1, acked), quick))  # waits for the only slot
        await asyncio.sleep(0.01)
        await window.release(grace_s=0.05)  # shutdown: 0 is cancelled and handed back
        await asyncio.wait_for(waiting, 1)  # 1 did not start: handed back too
        await asyncio.wait_for(h.submit(window, FakeEvent(2, acked), quick), 1)  # after the shutdown
        assert acked == [] and sorted(forgotten) == [0, 1, 2]

    asyncio.run(run())


def test_an_event_held_before_submit_across_a_rebalance_is_given_back_not_handled():
    """The input agent holds an event while the input gate is closed; if a rebalance
    releases the window meanwhile, the event belongs to the old assignment (its partition
    was sought back to the committed offset) and must not be handled or acked."""

    async def run():
        h = Harness()
        acked, forgotten, handled = [], h.forgotten, []
        window = h.window(4)

        async def handle(offset):
            handled.append(offset)

        taken_in = window.generation  # event 7 taken while the gate is closed
        seven = h.acks.track(FakeEvent(7, acked))
        await window.release(grace_s=0.05)  # a rebalance while the gate holds it
        window.reopen()  # the next assignment
        h.acks.reset()
        await window.submit(seven, lambda: handle(7), generation=taken_in)  # the gate opens
        await h.submit(window, FakeEvent(3, acked), lambda: handle(3))  # the re-read, new generation
        await window.join()
        assert handled == [3] and acked == [3] and forgotten == [7]

    asyncio.run(run())


def test_a_halted_worker_starts_no_step_even_at_the_next_assignment_while_running_steps_finish():
    """A worker whose transaction failed restarts after a grace period: a step started
    meanwhile would call the model for an output that can never commit, and the restarted
    worker would call it again (paid twice). Halted, the windows start nothing more, even if
    an assignment comes before the restart; the steps already running finish."""
    from dlqapp.processing.windows import InFlightWindows

    async def run():
        h = Harness()
        acked: list[int] = []
        forgotten, handled = h.forgotten, []
        windows = InFlightWindows(4, 1.0, steps=h.steps, acks=h.acks, progress=None, guard=None)
        window = windows.new(on_poison=lambda ticket, exc: None, on_stop=lambda exc: None)
        running = asyncio.Event()

        async def slow(offset):
            await running.wait()
            handled.append(offset)

        async def handle(offset):
            handled.append(offset)

        await h.submit(window, FakeEvent(1, acked), lambda: slow(1))
        windows.halt()
        await h.submit(window, FakeEvent(2, acked), lambda: handle(2))
        running.set()
        await window.join()
        assert handled == [1] and 2 in forgotten  # 1 ran to its end; 2 never started
        windows.reopen()  # an assignment before the restart
        h.acks.reset()
        await h.submit(window, FakeEvent(3, acked), lambda: handle(3))
        await window.join()
        assert handled == [1] and 3 in forgotten and not window.accepting

    asyncio.run(run())


def test_the_windows_share_one_grace_period_at_a_release():
    """A stop gives every window's running steps the same grace period (DLQ_DRAIN_TIMEOUT),
    not one after another: each step here ends only once both windows are closed, which one
    window after another would reach only after the first window's grace ran out (cancelling
    its step, handed back unacked)."""
    from dlqapp.processing.windows import InFlightWindows

    async def run():
        h = Harness()
        acked: list[int] = []
        windows = InFlightWindows(4, 2.0, steps=h.steps, acks=h.acks, progress=None, guard=None)
        first, second = (windows.new(on_poison=lambda ticket, exc: None, on_stop=lambda exc: None) for _ in range(2))
        both_closed, handled = asyncio.Event(), []

        async def held(offset):
            await both_closed.wait()
            handled.append(offset)

        async def close_watch():
            while first.accepting or second.accepting:
                await asyncio.sleep(0)
            both_closed.set()

        await h.submit(first, FakeEvent(1, acked, partition=0), lambda: held(1))
        await h.submit(second, FakeEvent(2, acked, partition=1), lambda: held(2))
        watch = asyncio.create_task(close_watch())
        released = await windows.release()
        await watch
        assert released == 0 and sorted(handled) == [1, 2] and not h.forgotten

    asyncio.run(run())


def test_a_release_hands_back_at_once_a_step_only_waiting_to_call_while_running_steps_get_their_grace():
    """A request held by an open breaker (or waiting for a backend slot) has made no
    call and sent nothing: a stop hands it back at once, also when it comes to wait during
    the grace period, instead of keeping the worker for the whole DLQ_DRAIN_TIMEOUT. A step
    that has sent an output keeps its grace (cancelling it would spoil its transaction), and
    so does one that made an attempt before it came to wait (a fallback waiting for a slot:
    handed back, its paid first call would be made again)."""

    async def run():
        h = Harness()
        acked: list[int] = []
        window = h.window(10)
        call_ends, never = asyncio.Event(), asyncio.Event()
        cancelled: list[int] = []

        def mark(*, sent: bool, called: bool) -> None:
            step = h.context.current()
            step.waiting, step.sent, step.called = True, sent, called

        async def waits(offset, *, first=None, sent=False, called=False):
            try:
                if first is not None:
                    await first.wait()  # running (a call) until the release has begun
                mark(sent=sent, called=called)
                await never.wait()
            except asyncio.CancelledError:
                cancelled.append(offset)
                raise

        async def calls():
            await call_ends.wait()

        released_begun = asyncio.Event()
        await h.submit(window, FakeEvent(0, acked, partition=1), calls)
        await h.submit(window, FakeEvent(1, acked), lambda: waits(1))
        await h.submit(window, FakeEvent(2, acked), lambda: waits(2, first=released_begun))
        await h.submit(window, FakeEvent(3, acked), lambda: waits(3, sent=True))
        await h.submit(window, FakeEvent(4, acked), lambda: waits(4, called=True))
        release = asyncio.create_task(window.release(grace_s=60))
        while window.accepting:
            await asyncio.sleep(0)
        released_begun.set()

        async def both_waiting_cancelled():
            while sorted(cancelled) != [1, 2]:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(both_waiting_cancelled(), 30)  # a failure guard: the grace is 60 s
        assert not release.done() and not {3, 4} & set(cancelled)  # the call and those steps go on
        call_ends.set()
        while window.in_flight > 2:
            await asyncio.sleep(0.01)
        assert acked == [0] and not release.done()  # steps 3 and 4: their grace, not cut short
        release.cancel()

    asyncio.run(run())
