"""The CLI's HTTP on the standard library (HTTP/1.1 on a socket; ``ssl`` only for
https://): what ``GpufleetClient`` sends when no httpx transport is given, so that a
command that asks the server once and prints (``gpufleet queue``, ``squeue``, ``scontrol
show job``) does not pay for importing httpx and httpcore (~25-30 ms, a fifth of such a
command; issue 31's fast CLI), nor ``http.client``, whose import with the ``email``
package it parses headers with is ~15 ms more. httpx stays for what streams
(``gpufleet logs``), for the agent and the gateway, and for tests that hand the client an
``httpx.MockTransport``.

It does what the client needs and no more: one keep-alive connection per server (one
found closed while idle is replaced before it is used, as httpcore does), a connect
timeout and a read timeout, TLS with the cluster CA (``GPUFLEET_CA_FILE``) or certifi's
bundle (httpx's default), JSON bodies, query parameters; an answer's body by
``Content-Length``, chunked, or to the end of the connection. Its failures are
``failover.Failure`` values: ``sent`` false only when no connection was made (refused,
unknown name, connect timeout, TLS handshake), as ``failover.failure_of`` says of
httpx's errors, and :func:`first_answer` walks the servers by ``failover``'s rule (the
same steps as ``failover.first_answer``, which catches httpx's errors by type).
"""

from __future__ import annotations

import json
import select
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import urlencode, urlsplit

from gpufleet.failover import PROXY_DOWN, Failure, NoAnswer, Servers, Switch, proxy_failure

if TYPE_CHECKING:
    import ssl

_MAX_LINE = 65536
"""The longest status or header line read (http.client's limit)."""
_MAX_HEADERS = 100


class Response:
    """An answer, read whole: what ``GpufleetClient`` reads of httpx's ``Response``."""

    def __init__(self, status: int, reason: str, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status
        self.reason_phrase = reason
        self.headers = headers
        """Names in lower case."""
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


class LiteError(Exception):
    """A request that got no answer; ``failure`` says why and whether it was sent."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.reason)
        self.failure = failure


class ProtocolError(Exception):
    """The server's bytes are not an HTTP/1.x answer (or it closed before one was whole)."""


def _reason(exc: BaseException, kind: str) -> str:
    text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return f"{kind}: {text}" if text else kind


class _Conn:
    """One kept connection: its socket and a buffered reader on it."""

    def __init__(self, sock: socket.socket, host: str) -> None:
        self.sock = sock
        self.host = host
        """The ``Host`` header: the URL's host and port as given."""
        self.rfile: BinaryIO = sock.makefile("rb")

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()


class LiteHTTP:
    """HTTP/1.1 on a plain socket (``ssl`` for https://, imported only then): not
    ``http.client``, whose import (with the ``email`` package it parses headers with, and
    ``ssl``) is ~15 ms of a command that asks the server once."""

    def __init__(
        self, *, headers: dict[str, str], timeout: float, connect_timeout: float, ca_file: str | None
    ) -> None:
        self.headers = {"Accept": "application/json", "User-Agent": "gpufleet", **headers}
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.ca_file = ca_file
        self._tls: ssl.SSLContext | None = None
        self._conns: dict[tuple[str, str], _Conn] = {}

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:
            import ssl

            cafile = self.ca_file
            if not cafile:
                import certifi  # httpx's default trust store

                cafile = certifi.where()
            self._tls = ssl.create_default_context(cafile=cafile)
        return self._tls

    def _connection(self, scheme: str, netloc: str) -> _Conn:
        """A connected connection to the server: the kept one unless the server closed it
        while idle (its socket reads as ready: EOF), else a new one (LiteError, not sent,
        when that fails)."""
        key = (scheme, netloc)
        conn = self._conns.get(key)
        if conn is not None:
            try:
                idle_closed = bool(select.select([conn.sock], [], [], 0)[0])
            except (OSError, ValueError):
                idle_closed = True
            if not idle_closed:
                return conn
            self._drop(scheme, netloc)
        parts = urlsplit(f"//{netloc}")
        host = parts.hostname or ""
        try:
            port = parts.port or (443 if scheme == "https" else 80)
            # an ASCII name as bytes (as getaddrinfo takes it; typeshed says str only): a str
            # is encoded with the ``idna`` codec, ~3 ms to import
            name: str | bytes = host.encode("ascii") if host.isascii() else host
            sock = socket.create_connection((name, port), self.connect_timeout)  # type: ignore[arg-type]
        except TimeoutError as exc:
            raise LiteError(Failure(_reason(exc, "ConnectTimeout"), sent=False)) from exc
        except (OSError, ValueError) as exc:  # refused, unknown name, a bad port
            raise LiteError(Failure(_reason(exc, "ConnectError"), sent=False)) from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if scheme == "https":
                sock = self._context().wrap_socket(sock, server_hostname=host)
        except TimeoutError as exc:
            sock.close()
            raise LiteError(Failure(_reason(exc, "ConnectTimeout"), sent=False)) from exc
        except OSError as exc:  # the TLS handshake (ssl.SSLError)
            sock.close()
            raise LiteError(Failure(_reason(exc, "ConnectError"), sent=False)) from exc
        sock.settimeout(self.timeout)
        conn = _Conn(sock, parts.netloc.rpartition("@")[2])
        self._conns[key] = conn
        return conn

    def request(
        self, method: str, url: str, *, params: dict[str, Any] | None = None, json: Any = None
    ) -> Response:
        """The answer to one request (any status); LiteError when there is none."""
        parts = urlsplit(url)
        target = parts.path or "/"
        query = urlencode(params, doseq=True) if params else ""
        if parts.query or query:
            target += "?" + "&".join(q for q in (parts.query, query) if q)
        body = b"" if json is None else _json_bytes(json)
        conn = self._connection(parts.scheme, parts.netloc)
        head = [f"{method} {target} HTTP/1.1", f"Host: {conn.host}"]
        head += [f"{k}: {v}" for k, v in self.headers.items()]
        if json is not None:
            head.append("Content-Type: application/json")
        if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            head.append(f"Content-Length: {len(body)}")
        try:
            conn.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
            status, reason, got, content, will_close = _read_answer(conn.rfile, method)
        except TimeoutError as exc:
            self._drop(parts.scheme, parts.netloc)
            raise LiteError(Failure(_reason(exc, "ReadTimeout"), sent=True)) from exc
        except (OSError, ProtocolError, ValueError) as exc:
            self._drop(parts.scheme, parts.netloc)
            raise LiteError(Failure(_reason(exc, type(exc).__name__), sent=True)) from exc
        if will_close:
            self._drop(parts.scheme, parts.netloc)
        return Response(status, reason, got, content)

    def _drop(self, scheme: str, netloc: str) -> None:
        conn = self._conns.pop((scheme, netloc), None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()


def _line(rfile: BinaryIO) -> bytes:
    line = rfile.readline(_MAX_LINE + 1)
    if len(line) > _MAX_LINE:
        raise ProtocolError("a line longer than 64 KiB")
    return line


def _read_answer(rfile: BinaryIO, method: str) -> tuple[int, str, dict[str, str], bytes, bool]:
    """(status, reason, headers with lower-case names, body, whether the connection ends
    with it): an HTTP/1.x answer, its informational (1xx) answers skipped; a body by
    ``Content-Length``, chunks, or up to the end of the connection."""
    while True:
        line = _line(rfile)
        if not line:
            raise ProtocolError("the server closed the connection without an answer")
        version, _, rest = line.decode("latin-1").rstrip("\r\n").partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {line[:80]!r}")
        status = int(code)
        headers: dict[str, str] = {}
        for _ in range(_MAX_HEADERS + 1):
            raw = _line(rfile)
            if raw in (b"\r\n", b"\n", b""):
                break
            name, sep, value = raw.decode("latin-1").partition(":")
            if not sep:
                raise ProtocolError(f"not a header line: {raw[:80]!r}")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        else:
            raise ProtocolError(f"more than {_MAX_HEADERS} headers")
        if not 100 <= status < 200:
            break
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    will_close = "close" in tokens or (version == "HTTP/1.0" and "keep-alive" not in tokens)
    if method == "HEAD" or status in (204, 304):
        return status, reason, headers, b"", will_close
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return status, reason, headers, _chunks(rfile), will_close
    length = headers.get("content-length")
    if length is None:
        return status, reason, headers, rfile.read(), True
    if not length.isdigit():
        raise ProtocolError(f"Content-Length: {length[:40]}")
    content = rfile.read(int(length))
    if len(content) < int(length):
        raise ProtocolError(f"the answer ended after {len(content)} of {length} bytes")
    return status, reason, headers, content, will_close


def _chunks(rfile: BinaryIO) -> bytes:
    out: list[bytes] = []
    while True:
        size_line = _line(rfile).split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise ProtocolError(f"a bad chunk size: {size_line[:40]!r}") from None
        if size == 0:
            while _line(rfile) not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(out)
        chunk = rfile.read(size)
        if len(chunk) < size or _line(rfile) not in (b"\r\n", b"\n"):
            raise ProtocolError("the answer ended inside a chunk")
        out.append(chunk)


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def first_answer(
    servers: Servers, send: Callable[[str], Response], *, repeatable: bool
) -> tuple[Response, Switch | None]:
    """``failover.first_answer`` for :class:`LiteHTTP`: the first answer from the servers
    in turn; NoAnswer (chained to the last failure) when the walk ends without one; a
    proxy's 502/503/504 moves on only with several servers."""
    walk = servers.walk(repeatable=repeatable)
    error: LiteError | None = None
    for url in walk:
        try:
            resp = send(url)
        except LiteError as exc:
            error = exc
            walk.failed(url, exc.failure)
            continue
        if resp.status_code in PROXY_DOWN and len(servers.urls) > 1:
            if walk.failed(url, proxy_failure(resp.status_code)):
                continue
            raise NoAnswer(walk.message(), resp)
        return resp, walk.answered(url)
    raise NoAnswer(walk.message()) from error


__all__ = ["LiteError", "LiteHTTP", "Response", "first_answer"]
