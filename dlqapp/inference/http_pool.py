"""A lean HTTP/1.1 client for one URL: POST a body, read the whole answer, keep the connection.

The openai backend needs one thing of HTTP, many times at once: a POST to one URL and its
whole response. aiohttp's client spent 343 µs of CPU per call at 1,024 calls in flight on
this project's machine, this pool 162 µs (`bench/run.py --only http_client`,
docs/performance.md). What it does:

- **one request per connection at a time**, connections kept alive and reused last-in
  first-out; one idle for `IDLE_S` is not reused but closed (below uvicorn's 5 s
  keep-alive, which closes a gateway's side first otherwise), as is one the server closed;
  the calls in flight are bounded by the caller (the backend slots, DLQ_CONCURRENCY), not
  here: a call never waits for a connection;
- responses parsed by httptools (llhttp, the parser of Node.js): `Content-Length`, chunked
  and close-delimited bodies (the last only when the server closes cleanly: a reset is a
  cut answer); a `gzip`/`deflate` body is decompressed (none is asked for);
- `https` with the system's certificate store and host name checks (`ssl.create_default_context`);
- **a call that does not end cleanly closes its connection** (a timeout, a cancellation, a
  malformed or cut-off response), so a late answer can never be read as another call's;
- never a retry: a POST to a model may have been paid for, so a failure is the caller's to
  retry (the tiers); redirects are not followed (a 3xx is an answer like any other);
- no proxies (as the aiohttp client before it, which did not read proxy variables).
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

IDLE_S = 4.0
"""An idle connection older than this is closed rather than reused."""
FORBIDDEN_IN_HEADERS = ("\r", "\n", "\0")


class HttpConnectionError(ConnectionError):
    """No (complete) response: the connection could not be made, was cut, or spoke no HTTP."""


@dataclass(frozen=True, slots=True)
class Response:
    """A whole HTTP response. Header names are lower-cased; a repeated header's values are
    joined with `, ` (RFC 9110's combination)."""

    status: int
    headers: dict[str, str]
    body: bytes


class _Connection(asyncio.Protocol):
    """One keep-alive connection: a request written, its response parsed as it arrives."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._aborted = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Response] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._headers_done = False
        self._framed = False
        """The body's end is known from its framing (a length or chunks), not from EOF."""
        self._keep_alive = False

    # -- the call ------------------------------------------------------------------------

    async def exchange(self, data: bytes, deadline: float | None = None) -> tuple[Response, bool]:
        """Write a request; its response, and whether the connection may be used again.

        Past `deadline` (the loop's clock) the call fails with TimeoutError and the
        connection is closed: one timer per call, cheaper than a timeout scope."""
        assert self.transport is not None and self._waiter is None
        if self.closed:  # lost already: a write would vanish and nothing would answer
            raise HttpConnectionError("the connection closed before the request was sent")
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        try:
            self.transport.write(data)
        except RuntimeError as exc:  # uvloop: the transport closed under us
            self._waiter = None
            raise HttpConnectionError(f"the connection closed before the request was sent: {exc}") from None
        timer = None if deadline is None else loop.call_at(deadline, self._time_out)
        try:
            response = await waiter
        finally:
            if timer is not None:
                timer.cancel()
        return response, self._keep_alive and not self.closed

    @property
    def usable(self) -> bool:
        """Open, and not on its way to closing (the server's close may not have reached us yet)."""
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        """Close at once (an unfinished call's answer must never be read by the next call)."""
        self.closed = self._aborted = True
        if self.transport is not None:
            self.transport.abort()

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(HttpConnectionError("the server switched protocols (101): not an HTTP answer"))
        except httptools.HttpParserError as exc:
            self._fail(HttpConnectionError(f"malformed HTTP response: {exc}"))

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if exc is None and self._headers_done and not self._framed and not self._aborted:  # ended by a clean close
            self.on_message_complete()
            return
        self._waiter = None
        who = "dlqapp closed" if self._aborted else "the server closed"
        reason = f": {exc}" if exc else ""
        waiter.set_exception(HttpConnectionError(f"{who} the connection before the whole response{reason}"))

    # -- httptools callbacks -------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._waiter is None:  # bytes nobody asked for: this connection cannot be trusted
            self._fail(HttpConnectionError("a response arrived for no request"))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._headers_done:
            return  # a chunked body's trailer: not a header of the response
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self._headers[key] = f"{self._headers[key]}, {text}" if key in self._headers else text

    def on_headers_complete(self) -> None:
        self._headers_done = True
        coding = self._headers.get("transfer-encoding", "").lower()
        self._framed = "content-length" in self._headers or "chunked" in coding

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        self._keep_alive = self._parser.should_keep_alive()  # read now: the parser resets for the next message
        headers, body = self._headers, b"".join(self._body)
        self._headers, self._body, self._headers_done, self._framed = {}, [], False, False
        if 100 <= status < 200:
            return  # an interim response (100 Continue, 103 Early Hints): the answer follows
        waiter, self._waiter = self._waiter, None
        if waiter is None or waiter.done():
            return
        try:
            waiter.set_result(Response(status, headers, _decoded(body, headers.get("content-encoding", ""))))
        except zlib.error as exc:
            waiter.set_exception(HttpConnectionError(f"undecodable {headers['content-encoding']} body: {exc}"))

    def _time_out(self) -> None:
        self._fail(TimeoutError("no whole response within the timeout"))

    def _fail(self, error: Exception) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        self.close()


def _decoded(body: bytes, encoding: str) -> bytes:
    """The body without its content coding (none is asked for; a server may still use one)."""
    encoding = encoding.strip().lower()
    if encoding == "gzip":
        return zlib.decompress(body, 16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        try:
            return zlib.decompress(body)
        except zlib.error:
            return zlib.decompress(body, -zlib.MAX_WBITS)  # raw deflate, as some servers send it
    return body


class HttpPool:
    """Keep-alive connections to the origin of one URL, POSTing to that URL (module doc)."""

    def __init__(self, url: str, *, max_idle: int, idle_s: float = IDLE_S) -> None:
        """`max_idle`: connections kept open between calls (more may be open during a burst)."""
        split = urlsplit(url)
        if split.scheme not in ("http", "https") or not split.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = split.hostname
        self.port = split.port or (443 if split.scheme == "https" else 80)
        self.target = (split.path or "/") + (f"?{split.query}" if split.query else "")
        self._host_header = split.netloc.rpartition("@")[2]
        self._tls = split.scheme == "https"
        self._ssl: ssl.SSLContext | None = None
        self.max_idle = max_idle
        self.idle_s = idle_s
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()

    async def post(
        self, body: bytes, headers: Iterable[tuple[str, str]], *, timeout_s: float | None = None
    ) -> Response:
        """POST `body` with `headers` (beside Host and Content-Length); the whole response.

        Raises `HttpConnectionError` when there is no whole response, `TimeoutError` when
        it is not whole within `timeout_s` (connecting included), `ValueError` for a header
        that would break the request (a line break or NUL in it)."""
        data = self._head(headers, len(body)) + body
        deadline = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
        connection = self._take()
        if connection is None:
            async with asyncio.timeout_at(deadline):
                connection = await self._connect()
        reusable = False
        try:
            response, reusable = await connection.exchange(data, deadline)
            return response
        finally:
            if reusable:
                self._give_back(connection)
            else:
                self._drop(connection)

    async def close(self) -> None:
        """Close every connection (a call still running gets a connection error)."""
        for connection in list(self._open):
            self._drop(connection)
        self._idle.clear()

    @property
    def open_connections(self) -> int:
        return len(self._open)

    # -- connections ---------------------------------------------------------------------

    def _take(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if connection.usable and now - connection.idle_since < self.idle_s:
                return connection
            self._drop(connection)
        return None

    def _give_back(self, connection: _Connection) -> None:
        if len(self._idle) >= self.max_idle:
            self._drop(connection)
            return
        connection.idle_since = time.monotonic()
        self._idle.append(connection)

    def _drop(self, connection: _Connection) -> None:
        connection.close()
        self._open.discard(connection)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        if self._tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            _, connection = await loop.create_connection(
                _Connection,
                self.host,
                self.port,
                ssl=self._ssl if self._tls else None,
                server_hostname=self.host if self._tls else None,
            )
        except OSError as exc:  # refused, unreachable, no such host, a TLS handshake refused
            raise HttpConnectionError(f"cannot connect to {self.host}:{self.port}: {exc}") from None
        self._open.add(connection)
        return connection

    def _head(self, headers: Iterable[tuple[str, str]], length: int) -> bytes:
        lines = [f"POST {self.target} HTTP/1.1", f"Host: {self._host_header}", f"Content-Length: {length}"]
        for name, value in headers:
            if any(c in name or c in value for c in FORBIDDEN_IN_HEADERS):
                raise ValueError(f"header {name!r} holds a line break or NUL; it cannot be sent")
            lines.append(f"{name}: {value}")
        lines.append("\r\n")
        return "\r\n".join(lines).encode("utf-8")
