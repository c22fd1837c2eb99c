"""The gateway's HTTP/1.1 client to replicas: a keep-alive pool of asyncio protocols
with httptools' response parser, in place of an aiohttp ``ClientSession``.

Why not aiohttp: per proxied request, its client cost more CPU than everything else
the gateway does (a ``ClientRequest`` and ``ClientResponse`` built, the URL parsed
again, the headers copied into a ``CIMultiDict``, a timer re-armed for every chunk
read, trace hooks, the writer's own buffering); issue 30 measured the gateway at
3.5-4.5x nginx's CPU per request. The gateway needs very little of that: it has the
raw request target and header pairs already, and passes the replica's raw header
pairs back. So a request here is one ``transport.write`` of a head built by joining
bytes, and the response is fed to the same C parser (llhttp, through httptools) that
uvicorn uses on the client side.

What it keeps of a client's duties:

* **Pool**: idle connections per ``host:port``, reused last-in first-out (the most
  recently used is the least likely to have been closed by the replica), retired
  after ``keepalive_s`` idle (a sweep closes them; ``acquire`` never hands one out
  past its age) and never handed out once the replica closed it (``connection_lost``
  seen). At most ``limit_per_host`` connections to one replica; more requests wait
  for one (FIFO).
* **Fresh connections** (``fresh=True``): a new connection that is closed after the
  answer, for a resend that must not meet a stale pooled connection again.
* **Timeouts**: ``connect_timeout_s`` to connect; ``read_timeout_s`` of silence
  before the response head and between body chunks (one timer per wait, not per chunk).
* **Errors**, each an ``UpstreamError`` with the verdict the gateway needs:
  ``ConnectFailed`` (refused, unreachable), ``ConnectTimeout`` (no accept in time),
  ``Disconnected`` (closed, or the write failed, before any byte of an answer: the
  request may be resent), ``ReadTimeout``, ``BadResponse`` (not HTTP, or cut short).
* **Bodies**: ``read()`` whole, or ``chunks()`` as they come (chunked transfer
  decoded, as the gateway's client side re-frames them); reading pauses when more
  than ``HIGH_WATER`` bytes wait unread (a slow client slows the replica's socket,
  not the gateway's memory). A response without a length ends with its connection.
  HEAD, 1xx, 204 and 304 have no body.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import httptools

HIGH_WATER = 256 * 1024
"""Unread body bytes above which the replica's socket stops being read."""
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
"""Methods that carry ``Content-Length: 0`` when their body is empty (as browsers and
aiohttp send; a replica may answer 411 otherwise)."""


class UpstreamError(Exception):
    """A request to a replica that failed (subclasses say how)."""


class ConnectFailed(UpstreamError):
    """The connection was refused or could not be made."""


class ConnectTimeout(UpstreamError):
    """The replica did not accept the connection in ``connect_timeout_s``."""


class Disconnected(UpstreamError):
    """The connection closed (or the write failed) before any byte of an answer."""


class ReadTimeout(UpstreamError):
    """The replica was silent for ``read_timeout_s`` (before its head, or mid-body)."""


class BadResponse(UpstreamError):
    """The answer was not HTTP/1.x, or was cut short."""


class _Conn(asyncio.Protocol):
    """One connection to a replica, one request at a time (no pipelining)."""

    __slots__ = (
        "_body",
        "_buffered",
        "_complete",
        "_error",
        "_got_bytes",
        "_head",
        "_head_only",
        "_headers",
        "_keep",
        "_parser",
        "_paused",
        "_waiter",
        "closed",
        "fresh",
        "idle_since",
        "key",
        "transport",
    )

    def __init__(self, key: str, fresh: bool) -> None:
        self.key = key
        self.fresh = fresh
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser: Any = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._head: asyncio.Future[None] | None = None
        self._body: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._complete = False
        self._got_bytes = False
        self._head_only = False
        self._error: UpstreamError | None = None
        self._keep = False
        self._waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        if self._parser is None:  # bytes nobody asked for: the connection is unusable
            self.closed = True
            if self.transport is not None:
                self.transport.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(BadResponse(f"not an HTTP response: {exc}"))
            self.close()
        except httptools.HttpParserUpgrade:
            self._fail(BadResponse("the replica switched protocols"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        head = self._head
        if head is not None and not head.done():
            if self._got_bytes:
                head.set_exception(BadResponse(f"connection closed within the response head ({exc!r})"))
            else:
                head.set_exception(Disconnected(f"connection closed before any answer ({exc!r})"))
        elif self._parser is not None and not self._complete:
            if self._until_close():
                self._complete = True  # a body without a length ends with its connection
            else:
                self._fail(BadResponse(f"connection closed within the response body ({exc!r})"))
        self._wake()

    def pause_writing(self) -> None:  # request heads are small; bodies are written whole
        pass

    def resume_writing(self) -> None:
        pass

    # -- httptools callbacks ----------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # informational (103 Early Hints): the real answer follows
            self._headers = []
            return
        head = self._head
        if head is not None and not head.done():
            head.set_result(None)
        if self._head_only:
            self._keep = self._parser.should_keep_alive()
            self._complete = True

    def on_body(self, body: bytes) -> None:
        if self._head_only:
            return
        self._body.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if 100 <= self._parser.get_status_code() < 200:
            return
        self._keep = self._parser.should_keep_alive()  # read now: llhttp forgets it after
        self._complete = True
        self._wake()

    # -- the request's side ------------------------------------------------------------

    def begin(self, head_only: bool) -> asyncio.Future[None]:
        self._parser = httptools.HttpResponseParser(self)
        self._headers = []
        self._body.clear()
        self._buffered = 0
        self._complete = False
        self._got_bytes = False
        self._error = None
        self._keep = False
        self._head_only = head_only
        self._head = asyncio.get_running_loop().create_future()
        return self._head

    def _until_close(self) -> bool:
        """Whether the response's body is delimited by the connection's end."""
        for name, value in self._headers:
            lower = name.lower()
            if lower == b"content-length" or (lower == b"transfer-encoding" and b"chunked" in value.lower()):
                return False
        return True

    def _fail(self, exc: UpstreamError) -> None:
        head = self._head
        if head is not None and not head.done():
            head.set_exception(exc)
        else:
            self._error = exc
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def take(self) -> bytes:
        """Everything buffered (resumes reading)."""
        chunks = self._body
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()
        return data

    async def wait_body(self, timeout_s: float) -> None:
        """Until a chunk, the end, or a failure; ReadTimeout after ``timeout_s`` of silence."""
        loop = asyncio.get_running_loop()
        self._waiter = w = loop.create_future()
        timer = loop.call_later(timeout_s, _expire, w)
        try:
            await w
        finally:
            timer.cancel()
            self._waiter = None

    @property
    def reusable(self) -> bool:
        return self._complete and self._keep and not self.closed

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _expire(w: asyncio.Future[None]) -> None:
    if not w.done():
        w.set_exception(ReadTimeout("the replica was silent too long"))


class Response:
    """A replica's answer: status and raw headers read; the body to ``read`` or stream
    with ``chunks``. ``release`` (always) gives the connection back or closes it."""

    __slots__ = ("_conn", "_pool", "_read_timeout_s", "content_length", "raw_headers", "status")

    def __init__(self, conn: _Conn, pool: Upstream, read_timeout_s: float) -> None:
        self._conn: _Conn | None = conn
        self._pool = pool
        self._read_timeout_s = read_timeout_s
        self.status: int = conn._parser.get_status_code()
        self.raw_headers = conn._headers
        self.content_length: int | None = None
        for name, value in self.raw_headers:
            if name.lower() == b"content-length" and value.isdigit():
                self.content_length = int(value)

    async def read(self) -> bytes:
        """The whole body."""
        conn = self._conn
        if conn is not None and conn._complete and conn._error is None:  # all here already
            return conn.take() if conn._body else b""
        parts = []
        async for chunk in self.chunks():
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it comes (each item is what arrived since the last)."""
        conn = self._conn
        assert conn is not None, "the response was released"
        while True:
            if conn._error is not None:
                raise conn._error
            if conn._body:
                yield conn.take()
                continue
            if conn._complete:
                return
            if conn.closed:
                raise BadResponse("connection closed within the response body")
            await conn.wait_body(self._read_timeout_s)

    def release(self) -> None:
        """Back to the pool if the answer was read to its end and the connection may be
        kept; else closed. Idempotent."""
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        self._pool._release(conn)

    def close(self) -> None:
        """Abandon the answer: the connection is closed (the replica stops sending)."""
        conn = self._conn
        if conn is not None:
            conn.close()
            self.release()


class _Host:
    """The pool of one ``host:port``."""

    __slots__ = ("head", "host", "idle", "open", "port", "prefix", "waiters")

    def __init__(self, host: str, port: int, prefix: str = "") -> None:
        self.host = host
        self.port = port
        self.prefix = prefix
        """The endpoint URL's path, if it has one: put before every request's target."""
        name = f"[{host}]" if ":" in host else host
        self.head = f"Host: {name}{'' if port == 80 else f':{port}'}\r\n".encode("latin-1")
        """The Host header (the port left out when it is 80, as clients write it)."""
        self.idle: list[_Conn] = []
        self.open = 0
        self.waiters: deque[asyncio.Future[None]] = deque()


class Upstream:
    """Keep-alive connections to replicas (see the module docstring). One event loop
    owns it."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        keepalive_s: float,
        limit_per_host: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.keepalive_s = keepalive_s
        self.limit_per_host = limit_per_host
        self._clock = clock
        self._hosts: dict[str, _Host] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    async def request(
        self,
        base: str,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        *,
        fresh: bool = False,
    ) -> Response:
        """Send ``method target`` to ``base`` (``http://host:port``) and wait for the
        response head. ``headers``: what to send besides Host and Content-Length."""
        host = self._hosts.get(base)
        if host is None:
            host = self._hosts[base] = _host_of(base)
        conn = None if fresh else self._idle(host)
        if conn is None:
            conn = await self._connect(host, base, fresh)
        head = conn.begin(method == "HEAD")
        parts = [f"{method} {host.prefix}{target} HTTP/1.1\r\n".encode("latin-1"), host.head]
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        if body or method in _BODY_METHODS:
            parts.append(b"Content-Length: %d\r\n" % len(body))
        if fresh:
            parts.append(b"Connection: close\r\n")
        parts.append(b"\r\n")
        if body:
            parts.append(body)
        transport = conn.transport
        if conn.closed or transport is None or transport.is_closing():
            self._release(conn)
            raise Disconnected("the connection was closed before the request was written")
        try:
            transport.write(b"".join(parts))
        except (OSError, RuntimeError) as exc:
            self._release(conn)
            raise Disconnected(f"the request could not be written: {exc!r}") from exc
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.read_timeout_s, _expire_head, head)
        try:
            await head
        except BaseException:
            conn.close()
            self._release(conn)
            raise
        finally:
            timer.cancel()
        return Response(conn, self, self.read_timeout_s)

    def _idle(self, host: _Host) -> _Conn | None:
        """The most recently used idle connection still open and young enough."""
        idle = host.idle
        oldest = self._clock() - self.keepalive_s
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.idle_since > oldest:
                return conn
            conn.close()
            host.open -= 1
        return None

    async def _connect(self, host: _Host, base: str, fresh: bool) -> _Conn:
        limit = self.limit_per_host
        while limit and host.open >= limit:  # wait for a connection to come back
            waiter = asyncio.get_running_loop().create_future()
            host.waiters.append(waiter)
            await waiter
            if not fresh:
                conn = self._idle(host)
                if conn is not None:
                    return conn
        host.open += 1
        conn = _Conn(base, fresh)
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await asyncio.get_running_loop().create_connection(lambda: conn, host.host, host.port)
        except TimeoutError as exc:
            self._gone(host)
            raise ConnectTimeout(f"{base}: no connection in {self.connect_timeout_s:g} s") from exc
        except OSError as exc:
            self._gone(host)
            raise ConnectFailed(f"{base}: {exc}") from exc
        except BaseException:
            self._gone(host)
            raise
        return conn

    def _gone(self, host: _Host) -> None:
        host.open -= 1
        while host.waiters:
            w = host.waiters.popleft()
            if not w.done():
                w.set_result(None)
                return

    def _release(self, conn: _Conn) -> None:
        host = self._hosts.get(conn.key)
        if host is None:  # the pool was closed meanwhile
            conn.close()
            return
        if conn.reusable and not self._closed and not conn.fresh:
            conn.idle_since = self._clock()
            conn._parser = None
            host.idle.append(conn)
            if self._sweeper is None:
                loop = asyncio.get_running_loop()
                self._sweeper = loop.call_later(self.keepalive_s / 2, self._sweep)
            while host.waiters:
                w = host.waiters.popleft()
                if not w.done():
                    w.set_result(None)
                    break
            return
        conn.close()
        self._gone(host)

    def _sweep(self) -> None:
        """Close connections idle for ``keepalive_s`` (or closed by their replica)."""
        self._sweeper = None
        oldest = self._clock() - self.keepalive_s
        pending = False
        for host in self._hosts.values():
            keep = []
            for conn in host.idle:
                if conn.closed or conn.idle_since <= oldest:
                    conn.close()
                    host.open -= 1
                else:
                    keep.append(conn)
            host.idle = keep
            pending = pending or bool(keep)
        if pending and not self._closed:
            self._sweeper = asyncio.get_running_loop().call_later(self.keepalive_s / 2, self._sweep)

    async def close(self) -> None:
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for host in self._hosts.values():
            for conn in host.idle:
                conn.close()
            host.idle = []
        self._hosts = {}


def _expire_head(head: asyncio.Future[None]) -> None:
    if not head.done():
        head.set_exception(ReadTimeout("the replica sent no answer in time"))


def _host_of(base: str) -> _Host:
    """``http://host:port[/path]`` (the feed's endpoint URL) as a pool entry."""
    rest, slash, path = base.split("://", 1)[-1].partition("/")
    if rest.startswith("["):  # [v6]:port
        host, _, port = rest[1:].partition("]")
        port = port.lstrip(":")
    else:
        host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    return _Host(host, int(port) if port else 80, (slash + path).rstrip("/"))


__all__ = [
    "BadResponse",
    "ConnectFailed",
    "ConnectTimeout",
    "Disconnected",
    "ReadTimeout",
    "Response",
    "Upstream",
    "UpstreamError",
]
