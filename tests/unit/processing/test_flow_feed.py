"""The gated feed in front of the in-flight window: events held behind a closed input gate,
the open and closed limits, backlog, and release across rebalances."""

import asyncio

from dlqapp.processing.feed import GatedFeed
from tests.unit.processing.flow_fakes import FakeEvent, Harness, _reraise


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
        h = Harness()
        acked, seen = [], []
        gate = _gate()
        window = h.window(4)
        feed = GatedFeed(window, gate, open_limit=4, closed_limit=50)
        pump = asyncio.create_task(feed.run())
        gate.handed_over([b"hint"])  # closed
        for i in range(30):  # far more than the window: none of these puts may block
            current.set(i)
            await asyncio.wait_for(feed.put(h.acks.track(FakeEvent(i, acked)), lambda: _record(seen, current)), 1)
        await asyncio.sleep(0.01)
        assert seen == [] and feed.waiting == 30
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
        h = Harness()
        acked = []
        gate = _gate()
        release = asyncio.Event()
        window = h.window(1)
        feed = GatedFeed(window, gate, open_limit=2, closed_limit=5)
        pump = asyncio.create_task(feed.run())

        async def slow():
            await release.wait()

        await feed.put(h.acks.track(FakeEvent(0, acked)), slow)  # started: the window's only slot
        await _until(lambda: feed.waiting == 0)
        await feed.put(h.acks.track(FakeEvent(1, acked)), slow)  # waits: the pump takes it when a slot frees
        blocked = asyncio.create_task(feed.put(h.acks.track(FakeEvent(2, acked)), slow))  # 2 waiting: the limit
        await asyncio.sleep(0.02)
        assert not blocked.done()
        gate.handed_over([b"hint"])  # closing lifts the limit to 5
        await asyncio.wait_for(blocked, 1)
        await feed.put(h.acks.track(FakeEvent(3, acked)), slow)
        assert feed.waiting == 3
        release.set()
        gate.received(b"hint")
        await _until(lambda: len(acked) == 4)
        assert acked == [0, 1, 2, 3]
        pump.cancel()

    asyncio.run(run())


def test_a_record_read_ahead_of_its_turn_never_waits_for_room_in_the_read_ahead():
    """The tail read's requests (dlqapp.kafka.tail_read) are of tenants with little waiting:
    they join the fair queue at once, even while another tenant's flood fills the read-ahead."""

    async def run():
        h = Harness()
        acked = []
        release = asyncio.Event()
        window = h.window(1)
        feed = GatedFeed(window, _gate(), open_limit=2, closed_limit=5)
        pump = asyncio.create_task(feed.run())

        async def slow():
            await release.wait()

        await feed.put(h.acks.track(FakeEvent(0, acked)), slow, "a")
        await _until(lambda: feed.waiting == 0)
        await feed.put(h.acks.track(FakeEvent(1, acked)), slow, "a")
        flooded = asyncio.create_task(feed.put(h.acks.track(FakeEvent(2, acked)), slow, "a"))
        await asyncio.sleep(0.02)
        assert not flooded.done()  # the read-ahead is full: the flood waits
        ahead = h.acks.track_ahead(FakeEvent(9, acked), ("input", 0), 9)
        await asyncio.wait_for(feed.put(ahead, slow, "b", back_pressure=False), 1)
        assert feed.waiting_by_tenant() == {"a": 2, "b": 1}
        release.set()
        await asyncio.wait_for(flooded, 1)
        await _until(lambda: len(acked) == 3)
        assert acked == [0, 1, 2]  # 9 is acked through the consumer's own event, when it comes
        pump.cancel()

    asyncio.run(run())


def test_releasing_a_feed_gives_its_held_events_back_unacked():
    async def run():
        h = Harness()
        acked, forgotten = [], h.forgotten
        gate = _gate()
        window = h.window(4)
        feed = GatedFeed(window, gate, open_limit=4, closed_limit=10)
        gate.handed_over([b"hint"])
        for i in range(3):
            await feed.put(h.acks.track(FakeEvent(i, acked)), _reraise)
        assert feed.release() == 3 and forgotten == [0, 1, 2] and feed.waiting == 0 and acked == []

    asyncio.run(run())


def test_input_piling_up_behind_a_closed_gate_counts_as_backlogged_and_asks_the_gate_to_pause_fetching():
    async def run():
        h = Harness()
        gate = _gate()
        window = h.window(8)
        feed = GatedFeed(window, gate, open_limit=8, closed_limit=500)
        feed.backlog_at = 5
        gate.pause_fetching_when(feed.backlogged)
        applied = []

        async def set_paused(paused):
            applied.append(paused)

        runner = asyncio.create_task(gate.run(set_paused))
        gate.handed_over([b"hint"])
        await _until(lambda: applied[-1:] == [False])  # closed, but input is quiet: fetching goes on
        for i in range(5):
            await feed.put(h.acks.track(FakeEvent(i, [])), _reraise)
        await _until(lambda: applied[-1:] == [True])  # five held: now fetching pauses
        assert feed.backlogged()
        runner.cancel()

    asyncio.run(run())


def test_events_taken_while_the_windows_are_released_are_given_back_not_started_after_it():
    """During a rebalance the windows give running handlers a grace period; events the
    input agent takes meanwhile belong to the revoked assignment. Started afterwards, one
    held by an open breaker would never be acked and Faust would wait for it until the
    rebalance timed out."""
    from dlqapp.processing.windows import InFlightWindows

    async def run():
        h = Harness()
        acked, forgotten, started = [], h.forgotten, []
        windows = InFlightWindows(limit=4, drain_timeout_s=0.2, steps=h.steps, acks=h.acks, progress=None, guard=None)
        window = windows.new(_reraise, lambda exc: None)
        gate = _gate()
        feed = windows.feed(window, gate, closed_limit=10)
        pump = asyncio.create_task(feed.run())
        hold = asyncio.Event()

        async def held():
            started.append("held")
            await hold.wait()

        await feed.put(h.acks.track(FakeEvent(0, acked)), held)
        await _until(lambda: started == ["held"])
        releasing = asyncio.create_task(windows.release())  # 0 gets its grace period
        await asyncio.sleep(0.01)
        await feed.put(h.acks.track(FakeEvent(1, acked)), held)  # taken during the release
        gate.handed_over([b"hint"])
        await feed.put(h.acks.track(FakeEvent(2, acked)), held)  # and while the gate is closed
        await releasing
        gate.received(b"hint")
        await feed.put(h.acks.track(FakeEvent(3, acked)), held)  # after it, before the next assignment
        await asyncio.sleep(0.05)
        assert started == ["held"] and acked == [] and sorted(forgotten) == [0, 1, 2, 3]
        windows.reopen()  # the next assignment
        await feed.put(h.acks.track(FakeEvent(4, acked)), held)
        await _until(lambda: started == ["held", "held"])
        assert sorted(forgotten) == [0, 1, 2, 3]
        pump.cancel()

    asyncio.run(run())


def test_an_event_starts_at_once_when_nothing_waits_before_it_and_never_overtakes_one_that_does():
    """The feed starts an event itself when the gate is open, nothing is held and the window
    has room (no hop through its pump); an event taken while the pump is still handing an
    earlier one to the window waits behind it, so handlers start (and are acked) in offset order."""

    async def run():
        h = Harness()
        acked, started = [], []
        gate = _gate()
        window = h.window(4)
        feed = GatedFeed(window, gate, open_limit=8, closed_limit=8)

        def handler(i):
            async def handle():
                started.append(i)

            return handle

        await feed.put(h.acks.track(FakeEvent(0, acked)), handler(0))  # no pump running: started by `put` itself
        await _until(lambda: acked == [0])
        gate.handed_over([b"hint"])  # closed: the next one is held
        await feed.put(h.acks.track(FakeEvent(1, acked)), handler(1))
        submit, handing_over = window.submit, asyncio.Event()

        async def slow_submit(*args, **kwargs):  # the pump is suspended in the middle of a hand-over
            await handing_over.wait()
            await submit(*args, **kwargs)

        window.submit = slow_submit
        pump = asyncio.create_task(feed.run())
        gate.received(b"hint")  # open: the pump takes 1 and is handing it over
        await _until(lambda: feed.waiting == 0)
        await asyncio.wait_for(
            feed.put(h.acks.track(FakeEvent(2, acked)), handler(2)), 1
        )  # the window has room, but 1 is not started yet
        handing_over.set()
        await _until(lambda: len(acked) == 3)
        assert started == [0, 1, 2] and acked == [0, 1, 2]
        pump.cancel()

    asyncio.run(run())


def test_a_tenants_event_read_behind_another_tenants_flood_starts_in_its_turn():
    """Issue 42: backend slots were shared fairly, but a tenant's request waited behind the
    whole flood read before it; with a read-ahead the feed takes events by fair turns."""

    async def run():
        h = Harness()
        acked, started = [], []
        gate = _gate()
        window = h.window(1)
        feed = GatedFeed(window, gate, open_limit=1000, closed_limit=1000, window_limit=1)
        pump = asyncio.create_task(feed.run())
        step = asyncio.Event()

        def handler(name):
            async def handle():
                started.append(name)
                await step.wait()
                step.clear()

            return handle

        for i in range(200):  # tenant a's flood, read first
            await feed.put(h.acks.track(FakeEvent(i, acked)), handler(f"a{i}"), "a", 100)
        await feed.put(h.acks.track(FakeEvent(200, acked)), handler("b0"), "b", 100)  # read after it
        for _ in range(4):
            await _until(lambda: len(started) > len(acked))
            step.set()
            await asyncio.sleep(0.01)
        assert "b0" in started[:4], started[:4]
        pump.cancel()

    asyncio.run(run())


def test_an_open_gate_pushes_back_once_the_waiting_events_hold_the_byte_limit_whatever_their_count():
    """DLQ_READ_AHEAD_BYTES: a read-ahead of large requests stops at its memory, not its count;
    each event started gives its bytes back, and a release forgets them all."""

    async def run():
        h = Harness()
        acked = []
        gate = _gate()
        release = asyncio.Event()
        window = h.window(1)
        feed = GatedFeed(window, gate, open_limit=1000, closed_limit=1000, open_bytes=10_000)
        pump = asyncio.create_task(feed.run())

        async def slow():
            await release.wait()

        await feed.put(h.acks.track(FakeEvent(0, acked)), slow, size=9_000)  # started at once: holds nothing
        await _until(lambda: feed.waiting == 0)
        for i in (1, 2):
            await asyncio.wait_for(feed.put(h.acks.track(FakeEvent(i, acked)), slow, size=4_000), 1)
        assert feed.waiting == 2 and feed.waiting_bytes == 8_000
        blocked = asyncio.create_task(feed.put(h.acks.track(FakeEvent(3, acked)), slow, size=4_000))
        await asyncio.sleep(0.02)
        assert not blocked.done() and feed.waiting_bytes == 12_000  # kept, and the reader waits
        release.set()  # the window drains: the bytes of each event started come back
        await asyncio.wait_for(blocked, 1)
        await _until(lambda: len(acked) == 4)
        assert acked == [0, 1, 2, 3] and feed.waiting_bytes == 0
        release.clear()
        gate.handed_over([b"hint"])  # closed: only what arrives waits, no start
        for i in (4, 5):
            await feed.put(h.acks.track(FakeEvent(i, acked)), slow, size=7_000)
        assert feed.waiting_bytes == 14_000 and feed.release() == 2 and feed.waiting_bytes == 0
        pump.cancel()

    asyncio.run(run())
