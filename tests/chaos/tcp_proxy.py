"""A TCP proxy that adds a one-way delay to every chunk, in both directions, in order.

    proxy = DelayProxy(upstream=("127.0.0.1", 9092), delay_s=0.2).start()
    ...  # clients connect to proxy.address
    proxy.stop()

It runs its own asyncio loop in a background thread. Each direction of each connection
has a reader that stamps every chunk with the time it arrived and a writer that sends it
once `delay_s` has passed since then: a fixed latency (like a long link), not a
bandwidth limit, and chunks never overtake each other. `delay_s` may be changed while
it runs (it applies to chunks read from then on).

Kafka clients learn broker addresses from metadata, so a proxy in front of a broker is
only on the path when the broker advertises the proxy's address (see
tests/chaos/test_latency_faults.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque

from tests.support import free_port

CHUNK = 64 * 1024


class DelayProxy:
    def __init__(
        self, upstream: tuple[str, int], delay_s: float = 0.2, port: int | None = None, host: str = "127.0.0.1"
    ) -> None:
        self.upstream = upstream
        self.delay_s = delay_s
        self.host = host
        self.port = port or free_port()
        self.connections = 0
        """Connections accepted so far."""
        self.bytes_forwarded = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # -- lifecycle (called from the test's thread) ------------------------------------

    def start(self) -> DelayProxy:
        self._thread = threading.Thread(target=self._run, name=f"delay-proxy-{self.port}", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the proxy did not start within 10 s")
        if self._error is not None:
            raise RuntimeError(f"the proxy failed to start: {self._error!r}") from self._error
        return self

    def stop(self) -> None:
        """Close the listener and every connection, end the loop and the thread."""
        loop = self._loop
        if loop is None or self._thread is None:
            return
        if loop.is_running():
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(15)
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(15)
        self._loop = None

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the loop (background thread) -------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            self._server = loop.run_until_complete(
                asyncio.start_server(self._accept, self.host, self.port, backlog=256)
            )
        except BaseException as exc:  # e.g. the port was taken meanwhile
            self._error = exc
            self._started.set()
            loop.close()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _shutdown(self) -> None:
        # Connections first: Server.wait_closed() waits for them (on some Python versions).
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        upstream_writer: asyncio.StreamWriter | None = None
        try:
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
            except OSError:
                return  # the broker is down: the client sees the connection close
            pumps = [
                asyncio.create_task(self._pump(client_reader, upstream_writer)),
                asyncio.create_task(self._pump(upstream_reader, client_writer)),
            ]
            try:
                # Either side closing ends the connection (Kafka has no half-closed use).
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        except asyncio.CancelledError:
            pass  # stop(): end quietly (asyncio's server callback reports a cancelled task)
        finally:
            for writer in (client_writer, upstream_writer):
                if writer is not None:
                    writer.close()
            self._tasks.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy `reader` to `writer`, each chunk `delay_s` after it arrived, in order."""
        queue: deque[tuple[float, bytes]] = deque()
        ready = asyncio.Event()
        eof = False

        async def read() -> None:
            nonlocal eof
            try:
                while True:
                    chunk = await reader.read(CHUNK)
                    if not chunk:
                        return
                    queue.append((time.monotonic() + self.delay_s, chunk))
                    ready.set()
            except (ConnectionError, OSError):
                return
            finally:
                eof = True
                ready.set()

        reading = asyncio.create_task(read())
        try:
            while True:
                if not queue:
                    if eof:
                        return
                    ready.clear()
                    await ready.wait()
                    continue
                due, chunk = queue[0]
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                queue.popleft()
                writer.write(chunk)
                self.bytes_forwarded += len(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            return
        finally:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
