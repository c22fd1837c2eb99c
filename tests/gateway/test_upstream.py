"""``gateway.upstream``: the gateway's HTTP/1.1 client, against a raw asyncio server
whose answers are written byte for byte (what a replica may send, framing included)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from gpufleet.gateway.upstream import BadResponse, Upstream

ONE_MIB = 1024 * 1024


class RawServer:
    """Answers each request by its path: ``/len`` (Content-Length), ``/head`` (HEAD
    with a length and no body), ``/close`` (no length: the body ends with the
    connection), ``/big`` (1 MiB chunked), ``/junk`` (not HTTP), ``/bye`` (answers,
    then closes the connection a moment later). Counts connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                if path == b"/len":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello")
                elif path == b"/pre/len":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nprefixed")
                elif path == b"/head":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
                elif path == b"/close":
                    writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
                    await writer.drain()
                    return
                elif path == b"/big":
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    for _ in range(16):
                        writer.write(b"%x\r\n%s\r\n" % (ONE_MIB // 16, b"x" * (ONE_MIB // 16)))
                        await writer.drain()
                    writer.write(b"0\r\n\r\n")
                elif path == b"/junk":
                    writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
                elif path == b"/bye":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    await writer.drain()
                    await asyncio.sleep(0.05)
                    return
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def run(test: Callable[[Upstream, RawServer, str], Awaitable[None]], keepalive_s: float = 30.0) -> None:
    async def main() -> None:
        raw = RawServer()
        server = await asyncio.start_server(raw.handle, "127.0.0.1", 0)
        base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        up = Upstream(connect_timeout_s=2, read_timeout_s=5, keepalive_s=keepalive_s)
        try:
            await test(up, raw, base)
        finally:
            await up.close()
            server.close()

    asyncio.run(main())


async def fetch(up: Upstream, base: str, path: str, method: str = "GET") -> tuple[int, bytes]:
    resp = await up.request(base, method, path, [(b"X-Test", b"1")], b"")
    try:
        return resp.status, await resp.read()
    finally:
        resp.release()


def test_kept_alive_and_reused() -> None:
    async def t(up: Upstream, raw: RawServer, base: str) -> None:
        assert await fetch(up, base, "/len") == (200, b"hello")
        assert await fetch(up, base, "/len") == (200, b"hello")
        assert raw.connections == 1

    run(t)


def test_an_endpoint_url_with_a_path_prefixes_every_target() -> None:
    async def t(up: Upstream, raw: RawServer, base: str) -> None:
        assert await fetch(up, base + "/pre", "/len") == (200, b"prefixed")

    run(t)


def test_head_has_no_body_and_keeps_the_connection() -> None:
    async def t(up: Upstream, raw: RawServer, base: str) -> None:
        assert await asyncio.wait_for(fetch(up, base, "/head", "HEAD"), 2) == (200, b"")
        assert await fetch(up, base, "/len") == (200, b"hello")
        assert raw.connections == 1

    run(t)


def test_a_body_without_a_length_ends_with_the_connection() -> None:
    async def t(up: Upstream, raw: RawServer, base: str) -> None:
        assert await fetch(up, base, "/close") == (200, b"until the end")
        assert await fetch(up, base, "/len") == (200, b"hello")
        assert raw.connections == 2  # never reused

    run(t)


def test_a_large_chunked_body_streams_whole() -> None:
    async def t(up: Upstream, raw: RawServer, base: str) -> None:
        resp = await up.request(base, "GET", "/big", [], b"")
        got = 0
        async for chunk in resp.chunks():
            got += len(chunk)
            await asyncio.sleep(0)  # a reader slower than the socket: reading pauses
        resp.release()
        assert got == ONE_MIB
        assert await fetch(up, base, "/len") == (200, b"hello") and raw.connections == 1

    run(t)


def test_not_http_is_a_bad_response() -> None:
    async def t(up: Upstream, raw: RawServer, base: str) -> None:
        with pytest.raises(BadResponse):
            await fetch(up, base, "/junk")

    run(t)


@pytest.mark.parametrize("why", ["closed by the replica", "idle past keepalive_s"])
def test_a_closed_or_old_idle_connection_is_never_handed_out(why: str) -> None:
    async def t(up: Upstream, raw: RawServer, base: str) -> None:
        path = "/bye" if why == "closed by the replica" else "/len"
        assert await fetch(up, base, path) == (200, b"ok" if path == "/bye" else b"hello")
        await asyncio.sleep(0.3)
        assert await fetch(up, base, "/len") == (200, b"hello")  # no Disconnected
        assert raw.connections == 2

    run(t, keepalive_s=30.0 if why == "closed by the replica" else 0.2)
