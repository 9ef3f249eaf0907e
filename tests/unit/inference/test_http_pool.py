"""The backend's HTTP client against servers that write exactly the bytes each case needs."""

from __future__ import annotations

import asyncio
import gzip
import random
import socket
import ssl
import struct
import subprocess
import zlib
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from dlqapp.inference.http_pool import HttpConnectionError, HttpPool

Handler = Callable[[bytes, asyncio.StreamWriter, int], Awaitable[bool]]
"""Answers one request (its body, the writer, its number on this connection); False ends the connection."""


class Server:
    """A TCP server reading HTTP/1.1 POSTs and answering each through `handler`."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1/chat/completions"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = 0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                number += 1
                if not await self.handler(body, writer, number):
                    return
        finally:
            writer.close()


def answer(body: bytes, *, status: int = 200, extra: str = "") -> bytes:
    return f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def echo(body: bytes, writer: asyncio.StreamWriter, number: int) -> bool:
    writer.write(answer(b"echo:" + body))
    await writer.drain()
    return True


LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
CURRENT = {"loop": "asyncio"}


@pytest.fixture(autouse=True, params=sorted(LOOPS))
def _event_loop(request):
    """Every case on both event loops (the worker runs on uvloop: DLQ_EVENT_LOOP)."""
    CURRENT["loop"] = request.param


def run(test: Callable[[], Awaitable[None]]) -> None:
    with asyncio.Runner(loop_factory=LOOPS[CURRENT["loop"]]) as runner:
        runner.run(asyncio.wait_for(test(), 30))


def test_a_kept_alive_connection_carries_call_after_call_with_the_headers_given():
    async def test() -> None:
        async with Server(echo) as server:
            host = server.url.split("/")[2]
            pool = HttpPool(server.url, max_idle=4)
            for i in range(5):
                response = await pool.post(f"b{i}".encode(), [("X-Request-ID", f"r{i}")])
                assert (response.status, response.body) == (200, f"echo:b{i}".encode())
                assert response.headers["content-length"] == str(len(response.body))
            await pool.close()
        assert server.connections == 1
        head = server.requests[3][0].decode()
        assert head.startswith("POST /v1/chat/completions HTTP/1.1\r\n")
        assert "\r\nX-Request-ID: r3\r\n" in head and "\r\nContent-Length: 2\r\n" in head
        assert f"\r\nHost: {host}\r\n" in head

    run(test)


@pytest.mark.parametrize("seed", range(20))
def test_any_framing_split_anywhere_reads_the_whole_body(seed):
    """A random body, framed by length, by chunks or by the connection's close, written in
    random pieces: the call returns it whole, and reuses the connection only when it may."""
    rng = random.Random(seed)
    payload = rng.randbytes(rng.choice([0, 1, 10, 5000, 70_000]))
    framing = rng.choice(["length", "chunked", "close"])

    def response_bytes() -> bytes:
        if framing == "length":
            return answer(payload, extra="X-Dup: a\r\nX-Dup: b\r\n")
        if framing == "close":
            return b"HTTP/1.1 200 OK\r\nConnection: close\r\nX-Dup: a\r\nX-Dup: b\r\n\r\n" + payload
        chunks, rest = [], payload
        while rest:
            size = rng.randint(1, 9000)
            chunks.append(f"{size if size < len(rest) else len(rest):x}\r\n".encode() + rest[:size] + b"\r\n")
            rest = rest[size:]
        coding = rng.choice([b"chunked", b"Chunked", b"CHUNKED"])
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: " + coding + b"\r\nX-Dup: a\r\nX-Dup: b\r\n\r\n"
        return head + b"".join(chunks) + b"0\r\n\r\n"

    async def handler(body: bytes, writer: asyncio.StreamWriter, number: int) -> bool:
        data = response_bytes()
        while data:
            cut = rng.randint(1, max(1, len(data) // 3))
            writer.write(data[:cut])
            await writer.drain()
            data = data[cut:]
            if rng.random() < 0.3:
                await asyncio.sleep(0)
        return framing != "close"

    async def test() -> None:
        async with Server(handler) as server:
            pool = HttpPool(server.url, max_idle=4)
            for _ in range(3):
                response = await pool.post(b"{}", [])
                assert response.body == payload and response.headers["x-dup"] == "a, b"
            await pool.close()
        assert server.connections == (3 if framing == "close" else 1)

    run(test)


def test_a_response_cut_short_is_a_connection_error_and_its_connection_is_not_reused():
    async def handler(body: bytes, writer: asyncio.StreamWriter, number: int) -> bool:
        if body == b"cut":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")
            await writer.drain()
            return False
        return await echo(body, writer, number)

    async def test() -> None:
        async with Server(handler) as server:
            pool = HttpPool(server.url, max_idle=4)
            with pytest.raises(HttpConnectionError, match="before the whole response"):
                await pool.post(b"cut", [])
            assert (await pool.post(b"next", [])).body == b"echo:next"
            await pool.close()
        assert server.connections == 2

    run(test)


def test_bytes_that_are_not_http_are_a_connection_error():
    async def handler(body: bytes, writer: asyncio.StreamWriter, number: int) -> bool:
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        return True

    async def test() -> None:
        async with Server(handler) as server:
            pool = HttpPool(server.url, max_idle=4)
            with pytest.raises(HttpConnectionError, match="malformed HTTP response"):
                await pool.post(b"x", [])
            assert pool.open_connections == 0

    run(test)


@pytest.mark.parametrize("given_up_by", ["its timeout", "the caller"])
def test_a_call_given_up_closes_its_connection_so_its_late_answer_is_never_anothers(given_up_by):
    async def handler(body: bytes, writer: asyncio.StreamWriter, number: int) -> bool:
        if body == b"slow":
            await asyncio.sleep(0.3)
        return await echo(body, writer, number)

    async def slow_call(pool: HttpPool) -> None:
        if given_up_by == "its timeout":
            await pool.post(b"slow", [], timeout_s=0.05)
        else:
            async with asyncio.timeout(0.05):
                await pool.post(b"slow", [])

    async def test() -> None:
        async with Server(handler) as server:
            pool = HttpPool(server.url, max_idle=4)
            with pytest.raises(TimeoutError):
                await slow_call(pool)
            assert pool.open_connections == 0
            assert (await pool.post(b"fast", [])).body == b"echo:fast"
            await asyncio.sleep(0.4)  # the slow answer would have arrived by now
            assert (await pool.post(b"again", [])).body == b"echo:again"
            await pool.close()
        assert server.connections == 2

    run(test)


def test_an_answer_nobody_asked_for_drops_the_connection():
    answered: list[bytes] = []

    async def handler(body: bytes, writer: asyncio.StreamWriter, number: int) -> bool:
        answered.append(body)
        writer.write(answer(b"echo:" + body) + (answer(b"stray") if len(answered) == 1 else b""))
        await writer.drain()
        return True

    async def test() -> None:
        async with Server(handler) as server:
            pool = HttpPool(server.url, max_idle=4)
            assert (await pool.post(b"one", [])).body == b"echo:one"
            for _ in range(3):
                assert (await pool.post(b"two", [])).body == b"echo:two"
            await pool.close()
        assert server.connections == 2

    run(test)


def test_interim_responses_are_skipped_and_encoded_bodies_decoded():
    async def handler(body: bytes, writer: asyncio.StreamWriter, number: int) -> bool:
        coded = {b"gzip": gzip.compress(b"plain text"), b"deflate": zlib.compress(b"plain text")}.get(body)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        writer.write(answer(coded, extra=f"Content-Encoding: {body.decode()}\r\n") if coded else answer(b"plain text"))
        await writer.drain()
        return True

    async def test() -> None:
        async with Server(handler) as server:
            pool = HttpPool(server.url, max_idle=4)
            for coding in (b"gzip", b"deflate", b"identity"):
                assert (await pool.post(coding, [])).body == b"plain text"
            await pool.close()

    run(test)


def test_a_header_with_a_line_break_is_refused_before_anything_is_sent():
    async def test() -> None:
        async with Server(echo) as server:
            pool = HttpPool(server.url, max_idle=4)
            for value in ("a\r\nX-Evil: 1", "a\nb", "a\0"):
                with pytest.raises(ValueError, match="line break or NUL"):
                    await pool.post(b"x", [("X-Request-ID", value)])
            assert server.connections == 0 and pool.open_connections == 0

    run(test)


def test_idle_connections_are_reused_up_to_max_idle_and_expire():
    async def handler(body: bytes, writer: asyncio.StreamWriter, number: int) -> bool:
        await asyncio.sleep(0.05)
        return await echo(body, writer, number)

    async def test() -> None:
        async with Server(handler) as server:
            pool = HttpPool(server.url, max_idle=2)
            await asyncio.gather(*(pool.post(b"x", []) for _ in range(5)))
            assert (server.connections, pool.open_connections) == (5, 2)
            await asyncio.gather(*(pool.post(b"x", []) for _ in range(2)))
            assert server.connections == 5  # both kept connections reused
            pool.idle_s = 0.0
            await pool.post(b"x", [])
            assert (server.connections, pool.open_connections) == (6, 1)  # the old ones closed, not reused
            await pool.close()
            assert pool.open_connections == 0

    run(test)


def test_a_connection_the_server_closed_while_idle_is_not_used_again():
    async def handler(body: bytes, writer: asyncio.StreamWriter, number: int) -> bool:
        await echo(body, writer, number)
        return False  # closes after each answer, without saying so

    async def test() -> None:
        async with Server(handler) as server:
            pool = HttpPool(server.url, max_idle=4)
            for _ in range(3):
                assert (await pool.post(b"x", [])).body == b"echo:x"
                async with asyncio.timeout(5):
                    while pool._idle and not pool._idle[-1].closed:
                        await asyncio.sleep(0.01)
            await pool.close()
        assert server.connections == 3

    run(test)


def test_a_refused_connection_and_a_bad_url_are_named():
    async def test() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(HttpConnectionError, match=f"cannot connect to 127.0.0.1:{port}"):
            await HttpPool(f"http://127.0.0.1:{port}/v1", max_idle=1).post(b"x", [])

    run(test)
    for url in ("ftp://host/v1", "http:///v1", "localhost:8000/v1"):
        with pytest.raises(ValueError, match="not an http"):
            HttpPool(url, max_idle=1)


def test_https_checks_the_certificate_against_the_trusted_store(tmp_path, monkeypatch):
    """A server whose certificate the store does not trust is refused; trusted, it answers."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def serve(trusted: bool) -> None:
        handler_server = Server(echo)
        server = await asyncio.start_server(handler_server._serve, "127.0.0.1", 0, ssl=context)
        url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
        try:
            pool = HttpPool(url, max_idle=1)
            if trusted:
                assert (await pool.post(b"tls", [])).body == b"echo:tls"
            else:
                with pytest.raises(HttpConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
                    await pool.post(b"tls", [])
            await pool.close()
        finally:
            server.close()

    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    run(lambda: serve(trusted=False))
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    run(lambda: serve(trusted=True))


def test_a_kept_connection_already_closing_is_not_taken():
    """Closed at our end just now (its connection_lost not delivered yet): a new one is made."""

    async def test() -> None:
        async with Server(echo) as server:
            pool = HttpPool(server.url, max_idle=4)
            await pool.post(b"a", [])
            kept = pool._idle[-1]
            assert kept.transport is not None
            kept.transport.close()
            assert not kept.usable
            assert (await pool.post(b"b", [])).body == b"echo:b"
            await pool.close()
        assert server.connections == 2

    run(test)


def test_calls_running_when_the_pool_closes_end_with_a_connection_error_that_says_so():
    async def handler(body: bytes, writer: asyncio.StreamWriter, number: int) -> bool:
        await asyncio.sleep(5)
        return await echo(body, writer, number)

    async def test() -> None:
        async with Server(handler) as server:
            pool = HttpPool(server.url, max_idle=4)
            calls = [asyncio.ensure_future(pool.post(b"x", [])) for _ in range(3)]
            async with asyncio.timeout(5):
                while len(server.requests) < 3:
                    await asyncio.sleep(0.01)
            await pool.close()
            for call in calls:
                with pytest.raises(HttpConnectionError, match="dlqapp closed the connection"):
                    await call
            assert pool.open_connections == 0

    run(test)


def _closing_server(data: bytes, *, reset: bool) -> Handler:
    """Writes `data`, then closes cleanly, or with a reset (SO_LINGER 0)."""

    async def handler(body: bytes, writer: asyncio.StreamWriter, number: int) -> bool:
        writer.write(data)
        await writer.drain()
        await asyncio.sleep(0.05)
        if reset:
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return False

    return handler


@pytest.mark.parametrize(
    "data, reset, expected",
    [
        (b'HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n20\r\n{"choices', False, "before the whole response"),
        (b'HTTP/1.1 200 OK\r\nTransfer-Encoding: CHUNKED\r\n\r\n20\r\n{"choices', False, "before the whole response"),
        (b'HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\n{"choices', False, "before the whole response"),
        (b'HTTP/1.1 200 OK\r\n\r\n{"choices', True, "reset by peer"),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", False, "101"),
    ],
    ids=["chunked-capitalised", "chunked-upper", "short-of-its-length", "close-delimited-reset", "upgrade"],
)
def test_a_cut_answer_in_any_framing_is_a_connection_error_never_a_shorter_body(data, reset, expected):
    async def test() -> None:
        async with Server(_closing_server(data, reset=reset)) as server:
            pool = HttpPool(server.url, max_idle=4)
            with pytest.raises(HttpConnectionError, match=expected):
                await pool.post(b"x", [])
            assert pool.open_connections == 0

    run(test)


def test_a_close_delimited_answer_ended_cleanly_is_whole_and_trailers_are_not_headers():
    async def test() -> None:
        whole = b"HTTP/1.1 200 OK\r\n\r\n" + b'{"choices": []}'
        async with Server(_closing_server(whole, reset=False)) as server:
            pool = HttpPool(server.url, max_idle=4)
            assert (await pool.post(b"x", [])).body == b'{"choices": []}'
        trailer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-Trailer: t\r\n\r\n"
        async with Server(_closing_server(trailer, reset=False)) as server:
            response = await HttpPool(server.url, max_idle=4).post(b"x", [])
            assert response.body == b"ok" and "x-trailer" not in response.headers

    run(test)


def test_a_connection_lost_before_its_request_is_written_fails_at_once():
    async def test() -> None:
        async with Server(echo) as server:
            pool = HttpPool(server.url, max_idle=4)
            await pool.post(b"a", [])
            kept = pool._idle[-1]
            kept.connection_lost(None)  # as the loop delivers it
            with pytest.raises(HttpConnectionError, match="before the request was sent"):
                await kept.exchange(b"POST / HTTP/1.1\r\n\r\n")
            await pool.close()

    run(test)


def test_a_connection_that_never_becomes_usable_times_out():
    """An https server that accepts but never answers the TLS handshake: the call's timeout covers connecting."""
    accepted: list[socket.socket] = []

    async def test() -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        loop = asyncio.get_running_loop()
        port = listener.getsockname()[1]

        async def accept() -> None:
            while True:
                accepted.append((await loop.sock_accept(listener))[0])

        acceptor = asyncio.create_task(accept())
        pool = HttpPool(f"https://127.0.0.1:{port}/v1", max_idle=4)
        try:
            with pytest.raises(TimeoutError):
                await pool.post(b"{}", [], timeout_s=0.2)
            assert accepted  # it got as far as the handshake
            assert pool.open_connections == 0
        finally:
            acceptor.cancel()
            listener.close()
            for connection in accepted:
                connection.close()

    run(test)
