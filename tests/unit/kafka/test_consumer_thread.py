"""What the app's thread asks of Faust's consumer thread runs on the consumer thread's own loop.

- Closing the consumer while a rebalance reaches a stopping app: Faust ran the aiokafka
  client's and coordinator's `close()` on the app's loop; under uvloop a fenced worker
  restarting in place then died of SIGSEGV in the consumer thread.
- Waking a waiting poll when a partition comes back from a full stream buffer."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import uvloop

from dlqapp.kafka.faust_consumer_thread import FetchWaitConsumerThread, stop_on_its_loop


class FakeAiokafkaConsumer:
    """Records on which thread and loop its `stop()` ran."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.stops = 0
        self.ran_on: tuple[threading.Thread, asyncio.AbstractEventLoop] | None = None

    async def stop(self) -> None:
        self.stops += 1
        self.ran_on = (threading.current_thread(), asyncio.get_running_loop())
        self.stopped.set()


def consumer_thread() -> tuple[threading.Thread, asyncio.AbstractEventLoop]:
    """A thread running a uvloop loop of its own, as Faust's consumer thread does."""
    loop = uvloop.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="consumer-thread", daemon=True)
    thread.start()
    return thread, loop


def test_the_consumer_stops_on_its_own_loop_when_asked_from_the_apps_loop():
    thread, loop = consumer_thread()
    consumer = FakeAiokafkaConsumer()

    faust_thread = SimpleNamespace(_consumer=consumer, thread_loop=loop, close_asked=False)

    async def on_the_apps_loop() -> None:
        FetchWaitConsumerThread.close(faust_thread)  # what App._on_rebalance_when_stopped calls
        FetchWaitConsumerThread.close(faust_thread)  # and again at the other end of the rebalance

    try:
        asyncio.run(on_the_apps_loop())
        assert consumer.stopped.wait(5), "stop() never ran"
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(5)  # after anything scheduled before
        assert consumer.ran_on == (thread, loop)
        assert consumer.stops == 1
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_no_consumer_or_a_closed_loop_is_left_alone():
    loop = uvloop.new_event_loop()
    loop.close()
    consumer = FakeAiokafkaConsumer()
    stop_on_its_loop(consumer, loop)
    stop_on_its_loop(None, loop)
    assert not consumer.stopped.is_set()


def test_a_partition_back_from_a_full_buffer_wakes_the_waiting_poll_once():
    """Faust's flow control puts a partition back in the active set when its stream buffer
    drains (`on_buffer_drop`); the consumer thread's waiting poll is woken then, on its own
    loop, and only for a partition that was out."""
    from faust.types import TP

    from dlqapp.kafka.faust_consumer import _OrderedConsumer

    thread, loop = consumer_thread()
    woken: list[threading.Thread] = []
    try:
        waiter = asyncio.run_coroutine_threadsafe(_a_future(), loop).result(5)
        waiter.add_done_callback(lambda _: woken.append(threading.current_thread()))
        aiokafka = SimpleNamespace(_fetcher=SimpleNamespace(_fetch_waiters={waiter}))
        faust_thread = FetchWaitConsumerThread.__new__(FetchWaitConsumerThread)
        faust_thread.__dict__.update(_consumer=aiokafka, thread_loop=loop)
        consumer = _OrderedConsumer.__new__(_OrderedConsumer)
        tp = TP("input", 0)
        consumer.__dict__.update(_thread=faust_thread, _active_partitions=set(), _buffered_partitions=set())

        consumer.on_buffer_drop(tp)  # it was never out: nothing to wake
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(5)
        assert not waiter.done()

        consumer._buffered_partitions.add(tp)  # out while its buffer was full (Faust's on_buffer_full)
        consumer.on_buffer_drop(tp)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(5)
        assert waiter.done() and tp in consumer._active_partitions
        assert woken == [thread]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


async def _a_future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()
