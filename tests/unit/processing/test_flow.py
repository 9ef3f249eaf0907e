import asyncio

from dlqapp.flowcontrol.slots import DUE, NORMAL, SlotLimiter
from dlqapp.processing.flow import GatedFeed, InFlightWindow


class FakeEvent:
    def __init__(self, offset, acked):
        self.offset, self._acked = offset, acked

    def ack(self):
        self._acked.append(self.offset)
        return True


def test_window_acks_each_partition_in_offset_order_even_when_handlers_finish_out_of_order():
    async def run():
        acked = []
        gates = {i: asyncio.Event() for i in range(5)}
        window = InFlightWindow(10, on_error=_reraise, on_fatal=lambda exc: None)
        for i in range(5):
            async def handler(i=i):
                await gates[i].wait()
            await window.submit("p0", FakeEvent(i, acked), handler)
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


async def _reraise(event, exc):
    raise exc


def test_a_failing_handler_is_routed_and_acked_and_the_partition_moves_on():
    async def run():
        acked, routed, fatal = [], [], []
        async def route(event, exc):
            routed.append((event.offset, str(exc)))
        window = InFlightWindow(10, on_error=route, on_fatal=fatal.append)

        async def boom():
            raise RuntimeError("bug")

        async def fine():
            return None

        await window.submit("p0", FakeEvent(0, acked), boom)
        await window.submit("p0", FakeEvent(1, acked), fine)
        await window.join()
        assert routed == [(0, "bug")] and acked == [0, 1] and fatal == []

    asyncio.run(run())


def test_when_routing_fails_too_the_event_is_never_acked_and_the_worker_stops():
    async def run():
        acked, fatal = [], []
        window = InFlightWindow(10, on_error=_reraise, on_fatal=fatal.append)

        async def boom():
            raise RuntimeError("broker gone")

        async def fine():
            return None

        await window.submit("p0", FakeEvent(0, acked), boom)
        await window.submit("p0", FakeEvent(1, acked), fine)
        await window.join()
        assert acked == [] and isinstance(fatal[0], RuntimeError)

    asyncio.run(run())


def test_release_lets_quick_handlers_finish_cancels_held_ones_and_hands_back_the_unacked():
    async def run():
        acked, forgotten = [], []
        window = InFlightWindow(10, on_error=_reraise, on_fatal=lambda exc: None, forget=lambda e: forgotten.append(e.offset))
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

        await window.submit("p0", FakeEvent(0, acked), quick)
        await window.submit("p0", FakeEvent(1, acked), stuck)
        await window.submit("p0", FakeEvent(2, acked), quick)
        await window.submit("p1", FakeEvent(10, acked), quick)
        released = await asyncio.wait_for(window.release(grace_s=0.5), 5)
        assert acked == [0, 10]  # done and at the head of their partitions
        assert cancelled == [True]
        assert sorted(forgotten) == [1, 2] and released == 2  # 2 finished behind 1: not acked either
        assert window.in_flight == 0
        window.reopen()  # the next assignment
        await window.submit("p0", FakeEvent(3, acked), quick)
        await window.join()
        assert acked == [0, 10, 3]

    asyncio.run(run())


def test_events_taken_between_a_release_and_the_next_assignment_are_handed_back_not_started():
    """Between a rebalance's release and the next assignment, agents still take events of
    the assignment being revoked (from their queues, or a due hint the timer fired): none
    may start, or it runs for a partition another worker now owns and Faust's wait for
    acks hangs the rebalance until it ends."""
    async def run():
        acked, forgotten, handled = [], [], []
        window = InFlightWindow(4, on_error=_reraise, on_fatal=lambda exc: None, forget=lambda e: forgotten.append(e.offset))

        async def handle(offset):
            handled.append(offset)

        await window.release(grace_s=0.05)
        await window.submit("p0", FakeEvent(5, acked), lambda: handle(5))
        assert window.in_flight == 0 and forgotten == [5] and not window.accepting
        window.reopen()
        await window.submit("p0", FakeEvent(6, acked), lambda: handle(6))
        await window.join()
        assert handled == [6] and acked == [6] and forgotten == [5]

    asyncio.run(run())


def test_window_bounds_in_flight_handlers():
    async def run():
        window = InFlightWindow(2, on_error=_reraise, on_fatal=lambda exc: None)
        gate = asyncio.Event()
        acked = []
        for i in range(2):
            await window.submit("p", FakeEvent(i, acked), gate.wait)
        third = asyncio.create_task(window.submit("p", FakeEvent(2, acked), gate.wait))
        await asyncio.sleep(0.01)
        assert not third.done()
        gate.set()
        await third
        await window.join()
        assert acked == [0, 1, 2]

    asyncio.run(run())


def test_limiter_serves_high_priority_waiters_first():
    async def run():
        limiter = SlotLimiter(1)
        order = []
        hold = asyncio.Event()

        async def user(name, priority, wait=None):
            async with limiter.slot(priority):
                order.append(name)
                if wait:
                    await wait.wait()

        first = asyncio.create_task(user("first", NORMAL, hold))
        await asyncio.sleep(0)
        lows = [asyncio.create_task(user(f"low{i}", NORMAL)) for i in range(3)]
        await asyncio.sleep(0)
        high = asyncio.create_task(user("high", DUE))
        await asyncio.sleep(0)
        assert limiter.high_waiting == 1
        hold.set()
        await asyncio.gather(first, high, *lows)
        assert order == ["first", "high", "low0", "low1", "low2"]

    asyncio.run(run())


def test_limiter_never_exceeds_its_limit_and_survives_cancellation():
    async def run():
        limiter = SlotLimiter(3)
        active = peak = 0

        async def user(i):
            nonlocal active, peak
            async with limiter.slot(i % 2):
                active += 1
                peak = max(peak, active)
                await asyncio.sleep(0.001)
                active -= 1

        tasks = [asyncio.create_task(user(i)) for i in range(50)]
        await asyncio.sleep(0)
        tasks[10].cancel()
        tasks[20].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert peak == 3
        async with limiter.slot(NORMAL):  # every slot came back
            pass
        assert limiter.in_use == 0

    asyncio.run(run())



def test_an_event_submitted_during_or_after_a_release_is_given_back_at_once():
    async def run():
        acked, forgotten = [], []
        window = InFlightWindow(1, on_error=_reraise, on_fatal=lambda exc: None, forget=lambda e: forgotten.append(e.offset))
        gate = asyncio.Event()

        async def blocked():
            await gate.wait()

        async def quick():
            return None

        await window.submit("p0", FakeEvent(0, acked), blocked)
        waiting = asyncio.create_task(window.submit("p0", FakeEvent(1, acked), quick))  # waits for the only slot
        await asyncio.sleep(0.01)
        await window.release(grace_s=0.05)  # shutdown: 0 is cancelled and handed back
        await asyncio.wait_for(waiting, 1)  # 1 did not start: handed back too
        await asyncio.wait_for(window.submit("p0", FakeEvent(2, acked), quick), 1)  # after the shutdown
        assert acked == [] and sorted(forgotten) == [0, 1, 2]

    asyncio.run(run())


def test_an_event_held_before_submit_across_a_rebalance_is_given_back_not_handled():
    """The input agent holds an event while the input gate is closed; if a rebalance
    releases the window meanwhile, the event belongs to the old assignment (its partition
    was sought back to the committed offset) and must not be handled or acked."""
    async def run():
        acked, forgotten, handled = [], [], []
        window = InFlightWindow(4, on_error=_reraise, on_fatal=lambda exc: None, forget=lambda e: forgotten.append(e.offset))

        async def handle(offset):
            handled.append(offset)

        taken_in = window.generation  # event 7 taken while the gate is closed
        await window.release(grace_s=0.05)  # a rebalance while the gate holds it
        window.reopen()  # the next assignment
        await window.submit("p0", FakeEvent(7, acked), lambda: handle(7), generation=taken_in)  # the gate opens
        await window.submit("p0", FakeEvent(3, acked), lambda: handle(3))  # the re-read, new generation
        await window.join()
        assert handled == [3] and acked == [3] and forgotten == [7]

    asyncio.run(run())


def _gate():
    from dlqapp.flowcontrol.input_gate import InputGate

    return InputGate(lambda: True, clock=lambda: 0)


def test_a_closed_gate_keeps_taking_events_and_starts_them_in_order_once_it_opens():
    """The input agent must keep emptying its queue while the gate is closed (Faust's
    delivery loop, shared with due hints, stops whenever a queue is full); the events wait
    in the feed and start in order, each with its own context, when the gate opens."""
    import contextvars

    current = contextvars.ContextVar("current")

    async def run():
        acked, seen = [], []
        gate = _gate()
        window = InFlightWindow(4, on_error=_reraise, on_fatal=lambda exc: None)
        feed = GatedFeed(window, gate, open_limit=4, closed_limit=50)
        pump = asyncio.create_task(feed.run())
        gate.fired([b"hint"])  # closed
        for i in range(30):  # far more than the window: none of these puts may block
            current.set(i)
            await asyncio.wait_for(feed.put("p0", FakeEvent(i, acked), lambda: _record(seen, current)), 1)
        await asyncio.sleep(0.01)
        assert seen == [] and feed.held == 30
        gate.received(b"hint")  # open
        await _until(lambda: len(acked) == 30)
        assert seen == list(range(30)) and acked == list(range(30))
        pump.cancel()

    asyncio.run(run())


async def _record(seen, current):
    seen.append(current.get())


async def _until(condition, timeout=2.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def test_an_open_gate_pushes_back_at_the_open_limit_and_a_closing_gate_lifts_it():
    async def run():
        acked = []
        gate = _gate()
        release = asyncio.Event()
        window = InFlightWindow(1, on_error=_reraise, on_fatal=lambda exc: None)
        feed = GatedFeed(window, gate, open_limit=2, closed_limit=5)
        pump = asyncio.create_task(feed.run())

        async def slow():
            await release.wait()

        await feed.put("p0", FakeEvent(0, acked), slow)  # started: the window's only slot
        await _until(lambda: feed.held == 0)
        await feed.put("p0", FakeEvent(1, acked), slow)  # the pump waits for a slot with it
        await feed.put("p0", FakeEvent(2, acked), slow)
        blocked = asyncio.create_task(feed.put("p0", FakeEvent(3, acked), slow))  # 2 held: at the open limit
        await asyncio.sleep(0.02)
        assert not blocked.done()
        gate.fired([b"hint"])  # closing lifts the limit to 5
        await asyncio.wait_for(blocked, 1)
        assert feed.held == 2
        release.set()
        gate.received(b"hint")
        await _until(lambda: len(acked) == 4)
        assert acked == [0, 1, 2, 3]
        pump.cancel()

    asyncio.run(run())


def test_releasing_a_feed_gives_its_held_events_back_unacked():
    async def run():
        acked, forgotten = [], []
        gate = _gate()
        window = InFlightWindow(4, on_error=_reraise, on_fatal=lambda exc: None, forget=lambda e: forgotten.append(e.offset))
        feed = GatedFeed(window, gate, open_limit=4, closed_limit=10)
        gate.fired([b"hint"])
        for i in range(3):
            await feed.put("p0", FakeEvent(i, acked), _reraise)
        assert feed.release() == 3 and forgotten == [0, 1, 2] and feed.held == 0 and acked == []

    asyncio.run(run())


def test_input_piling_up_behind_a_closed_gate_counts_as_backlogged_and_asks_the_gate_to_pause_fetching():
    async def run():
        gate = _gate()
        window = InFlightWindow(8, on_error=_reraise, on_fatal=lambda exc: None)
        feed = GatedFeed(window, gate, open_limit=8, closed_limit=500)
        feed.backlog_at = 5
        gate.pause_fetching_when(feed.backlogged)
        applied = []

        async def set_paused(paused):
            applied.append(paused)

        runner = asyncio.create_task(gate.run(set_paused))
        gate.fired([b"hint"])
        await _until(lambda: applied[-1:] == [False])  # closed, but input is quiet: fetching goes on
        for i in range(5):
            await feed.put("p0", FakeEvent(i, []), _reraise)
        await _until(lambda: applied[-1:] == [True])  # five held: now fetching pauses
        assert feed.backlogged()
        runner.cancel()

    asyncio.run(run())


def test_events_taken_while_the_windows_are_released_are_given_back_not_started_after_it():
    """During a rebalance the windows give running handlers a grace period; events the
    input agent takes meanwhile belong to the revoked assignment. Started afterwards, one
    held by an open breaker would never be acked and Faust would wait for it until the
    rebalance timed out."""
    from dlqapp.processing.flow import InFlightWindows

    async def run():
        acked, forgotten, started = [], [], []
        windows = InFlightWindows(limit=4, drain_timeout_s=0.2)
        window = windows.new(_reraise, lambda exc: None, lambda e: forgotten.append(e.offset), None)
        gate = _gate()
        feed = windows.feed(window, gate, closed_limit=10)
        pump = asyncio.create_task(feed.run())
        hold = asyncio.Event()

        async def held():
            started.append("held")
            await hold.wait()

        await feed.put("p0", FakeEvent(0, acked), held)
        await _until(lambda: started == ["held"])
        releasing = asyncio.create_task(windows.release())  # 0 gets its grace period
        await asyncio.sleep(0.01)
        await feed.put("p0", FakeEvent(1, acked), held)  # taken during the release
        gate.fired([b"hint"])
        await feed.put("p0", FakeEvent(2, acked), held)  # and while the gate is closed
        await releasing
        gate.received(b"hint")
        await feed.put("p0", FakeEvent(3, acked), held)  # after it, before the next assignment
        await asyncio.sleep(0.05)
        assert started == ["held"] and acked == [] and sorted(forgotten) == [0, 1, 2, 3]
        windows.reopen()  # the next assignment
        await feed.put("p0", FakeEvent(4, acked), held)
        await _until(lambda: started == ["held", "held"])
        assert sorted(forgotten) == [0, 1, 2, 3]
        pump.cancel()

    asyncio.run(run())


def test_an_event_starts_at_once_when_nothing_waits_before_it_and_never_overtakes_one_that_does():
    """The feed starts an event itself when the gate is open, nothing is held and the window
    has room (no hop through its pump); an event taken while the pump is still handing an
    earlier one to the window waits behind it, so handlers start (and are acked) in offset order."""

    async def run():
        acked, started = [], []
        gate = _gate()
        window = InFlightWindow(4, on_error=_reraise, on_fatal=lambda exc: None)
        feed = GatedFeed(window, gate, open_limit=8, closed_limit=8)

        def handler(i):
            async def handle():
                started.append(i)
            return handle

        await feed.put("p0", FakeEvent(0, acked), handler(0))  # no pump running: started by `put` itself
        await _until(lambda: acked == [0])
        gate.fired([b"hint"])  # closed: the next one is held
        await feed.put("p0", FakeEvent(1, acked), handler(1))
        submit, handing_over = window.submit, asyncio.Event()

        async def slow_submit(*args, **kwargs):  # the pump is suspended in the middle of a hand-over
            await handing_over.wait()
            await submit(*args, **kwargs)

        window.submit = slow_submit
        pump = asyncio.create_task(feed.run())
        gate.received(b"hint")  # open: the pump takes 1 and is handing it over
        await _until(lambda: feed.held == 0)
        await asyncio.wait_for(feed.put("p0", FakeEvent(2, acked), handler(2)), 1)  # the window has room, but 1 is not started yet
        handing_over.set()
        await _until(lambda: len(acked) == 3)
        assert started == [0, 1, 2] and acked == [0, 1, 2]
        pump.cancel()

    asyncio.run(run())
