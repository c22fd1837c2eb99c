"""The CLI's HTTP on the standard library (``http.client``): what ``GpufleetClient`` sends
when no httpx transport is given, so that a command that asks the server once and prints
(``gpufleet queue``, ``squeue``, ``scontrol show job``) does not pay for importing httpx
and httpcore (~25-30 ms, a fifth of such a command; issue 31's fast CLI). httpx stays
for what streams (``gpufleet logs``), for the agent and the gateway, and for tests that
hand the client an ``httpx.MockTransport``.

It does what the client needs and no more: one keep-alive connection per server (one
found closed while idle is replaced before it is used, as httpcore does), a connect
timeout and a read timeout, TLS with the cluster CA (``GPUFLEET_CA_FILE``) or certifi's
bundle (httpx's default), JSON bodies, query parameters. Its failures are
``failover.Failure`` values: ``sent`` false only when no connection was made (refused,
unknown name, connect timeout, TLS handshake), as ``failover.failure_of`` says of
httpx's errors, and :func:`first_answer` walks the servers by ``failover``'s rule (the
same steps as ``failover.first_answer``, which catches httpx's errors by type).
"""

from __future__ import annotations

import http.client
import json
import select
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

from gpufleet.failover import PROXY_DOWN, Failure, NoAnswer, Servers, Switch, proxy_failure

if TYPE_CHECKING:
    import ssl


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


def _reason(exc: BaseException, kind: str) -> str:
    text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return f"{kind}: {text}" if text else kind


class LiteHTTP:
    def __init__(
        self, *, headers: dict[str, str], timeout: float, connect_timeout: float, ca_file: str | None
    ) -> None:
        self.headers = {"Accept": "application/json", "User-Agent": "gpufleet", **headers}
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.ca_file = ca_file
        self._tls: ssl.SSLContext | None = None
        self._conns: dict[tuple[str, str], http.client.HTTPConnection] = {}

    def _context(self) -> ssl.SSLContext:
        if self._tls is None:
            import ssl

            cafile = self.ca_file
            if not cafile:
                import certifi  # httpx's default trust store

                cafile = certifi.where()
            self._tls = ssl.create_default_context(cafile=cafile)
        return self._tls

    def _connection(self, scheme: str, netloc: str) -> http.client.HTTPConnection:
        """A connected connection to the server: the kept one unless the server closed it
        while idle (its socket reads as ready: EOF), else a new one (LiteError, not sent,
        when that fails)."""
        key = (scheme, netloc)
        conn = self._conns.get(key)
        if conn is not None and conn.sock is not None:
            try:
                idle_closed = bool(select.select([conn.sock], [], [], 0)[0])
            except (OSError, ValueError):
                idle_closed = True
            if not idle_closed:
                return conn
            conn.close()
        if scheme == "https":
            conn = http.client.HTTPSConnection(netloc, timeout=self.connect_timeout, context=self._context())
        else:
            conn = http.client.HTTPConnection(netloc, timeout=self.connect_timeout)
        try:
            conn.connect()
        except TimeoutError as exc:
            conn.close()
            raise LiteError(Failure(_reason(exc, "ConnectTimeout"), sent=False)) from exc
        except OSError as exc:  # refused, unknown name, TLS handshake (ssl.SSLError)
            conn.close()
            raise LiteError(Failure(_reason(exc, "ConnectError"), sent=False)) from exc
        assert conn.sock is not None
        conn.sock.settimeout(self.timeout)
        self._conns[key] = conn
        return conn

    def request(
        self,
        method: str,
        url: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        timeout: float | None = None,
    ) -> Response:
        """The answer to one request (any status); LiteError when there is none.
        ``timeout``: this request's read timeout, instead of the client's (a bulk change
        the caller waits for however long it takes)."""
        parts = urlsplit(url)
        target = parts.path or "/"
        query = urlencode(params, doseq=True) if params else ""
        if parts.query or query:
            target += "?" + "&".join(q for q in (parts.query, query) if q)
        headers = dict(self.headers)
        body = None
        if json is not None:
            body = _json_bytes(json)
            headers["Content-Type"] = "application/json"
        conn = self._connection(parts.scheme, parts.netloc)
        if timeout is not None and conn.sock is not None:
            conn.sock.settimeout(timeout)
        try:
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
            content = resp.read()
            if timeout is not None and conn.sock is not None:
                conn.sock.settimeout(self.timeout)
        except TimeoutError as exc:
            self._drop(parts.scheme, parts.netloc)
            raise LiteError(Failure(_reason(exc, "ReadTimeout"), sent=True)) from exc
        except (OSError, http.client.HTTPException) as exc:
            self._drop(parts.scheme, parts.netloc)
            raise LiteError(Failure(_reason(exc, type(exc).__name__), sent=True)) from exc
        if resp.will_close:
            self._drop(parts.scheme, parts.netloc)
        got = {k.lower(): v for k, v in resp.getheaders()}
        return Response(resp.status, resp.reason, got, content)

    def _drop(self, scheme: str, netloc: str) -> None:
        conn = self._conns.pop((scheme, netloc), None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()


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
