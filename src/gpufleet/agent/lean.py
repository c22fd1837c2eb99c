"""The agent's HTTP/1.1 transport for httpx: the standard library's ``http.client`` on
kept-alive connections, in place of httpcore and h11.

Why: an idle node's whole traffic is a lease renewal every 10 s and a long-poll every
~20 s (``renewal.py``, ``doorbell.py``), tens of bytes each, and httpcore + h11 spent
about 1.2 ms of CPU on each of them (``bench/bench_idle.py``: the agents of a 50-node
fleet at rest, py-spy; a plain ``http.client`` round trip to the same server costs a
fraction of that). The httpx ``Client`` stays (its API, its errors, ``failover.py``'s
reading of them); only the transport under it changes.

What it keeps of httpcore's duties, the agent's way:

* **Connections**: one kept per scheme, host and port, taken for a request and put back
  after its answer was read whole (a second thread using the same client meanwhile gets
  a connection of its own); retired after ``keepalive_s`` idle (15 s, under the server's
  20 s ``--keep-alive``) and never reused once the server closed it (readable while idle:
  its FIN, as httpcore checks) or said ``Connection: close``.
* **Timeouts**: the request's own (``Client(timeout=...)``, per-request overrides): connect,
  then read for each wait on the socket.
* **Errors** as httpx raises them, so ``failover.failure_of`` tells "never sent" from
  "may have been seen": ``ConnectError`` / ``ConnectTimeout`` before the request went out,
  ``WriteError`` / ``WriteTimeout`` while it did, ``ReadTimeout``, ``RemoteProtocolError``
  (closed without an answer) and ``ReadError`` after. Nothing is resent here (a resend is
  ``failover.first_answer``'s call: it knows which requests are idempotent).
* **Bodies**: the request's read whole (the agent's are JSON in memory); the answer's read
  whole by ``http.client`` (length or chunked), handed to httpx undecoded (httpx decodes
  ``Content-Encoding`` as it always does).

``lean_transport`` decides where it is used: plain HTTP, or HTTPS with the agent's own
``ssl.SSLContext`` (its cluster CA, its node certificate); not where httpx would apply an
environment proxy (``HTTP_PROXY`` and the rest), nor HTTPS on httpx's default trust
store; there httpx's own transport stays.
"""

from __future__ import annotations

import http.client
import select
import ssl
import threading
import time
import urllib.request

import httpx

__all__ = ["LeanTransport", "lean_transport"]

_Key = tuple[str, str, int]


class LeanTransport(httpx.BaseTransport):
    """See the module docstring. ``context``: the TLS context for ``https`` URLs."""

    def __init__(self, *, context: ssl.SSLContext | None, keepalive_s: float) -> None:
        self._context = context
        self._keepalive_s = keepalive_s
        self._idle: dict[_Key, list[tuple[http.client.HTTPConnection, float]]] = {}
        self._lock = threading.Lock()
        self._closed = False

    # -- connections -----------------------------------------------------------------

    def _take(self, key: _Key) -> http.client.HTTPConnection | None:
        """A kept connection to ``key`` still fit to send on, or None."""
        oldest = time.monotonic() - self._keepalive_s
        while True:
            with self._lock:
                idle = self._idle.get(key)
                if not idle:
                    return None
                conn, since = idle.pop()
            if since > oldest and _quiet(conn):
                return conn
            conn.close()

    def _give(self, key: _Key, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed:
                self._idle.setdefault(key, []).append((conn, time.monotonic()))
                return
        conn.close()

    def _connect(self, key: _Key, timeout: float | None) -> http.client.HTTPConnection:
        scheme, host, port = key
        conn: http.client.HTTPConnection
        if scheme == "https":
            conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=self._context)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            conn.connect()
        except TimeoutError as exc:
            conn.close()
            raise httpx.ConnectTimeout(f"no connection to {host}:{port} in {timeout} s") from exc
        except (OSError, ssl.SSLError) as exc:  # refused, unreachable, an unknown name, TLS
            conn.close()
            raise httpx.ConnectError(f"{host}:{port}: {exc}") from exc
        return conn

    # -- httpx.BaseTransport -----------------------------------------------------------

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.scheme
        port = url.port or (443 if scheme == "https" else 80)
        key = (scheme, url.host, port)
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        body = request.read()
        conn = self._take(key)
        if conn is None:
            conn = self._connect(key, timeouts.get("connect"))
        try:
            sock = conn.sock
            if sock is not None:
                sock.settimeout(timeouts.get("write"))
            try:
                conn.putrequest(
                    request.method, url.raw_path.decode("ascii"), skip_host=True, skip_accept_encoding=True
                )
                for name, value in request.headers.raw:
                    conn.putheader(name, value)
                conn.endheaders(body or None)
            except TimeoutError as exc:
                raise httpx.WriteTimeout(str(exc) or "the request could not be written in time") from exc
            except (OSError, http.client.HTTPException) as exc:
                raise httpx.WriteError(f"the request could not be written: {exc!r}") from exc
            if conn.sock is not None:
                conn.sock.settimeout(timeouts.get("read"))
            try:
                resp = conn.getresponse()
                content = resp.read()
            except TimeoutError as exc:
                raise httpx.ReadTimeout(str(exc) or "no answer in time") from exc
            except http.client.RemoteDisconnected as exc:
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.") from exc
            except (OSError, http.client.HTTPException) as exc:
                raise httpx.ReadError(f"the answer could not be read: {exc!r}") from exc
        except BaseException:
            conn.close()
            raise
        if resp.will_close:
            conn.close()
        else:
            self._give(key, conn)
        return httpx.Response(
            resp.status,
            headers=resp.getheaders(),
            content=content,
            request=request,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": resp.reason.encode("latin-1")},
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn, _ in conns:
                conn.close()


def _quiet(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle connection is still open and silent: readable means the server
    closed it (or sent what nobody asked for); either way it is not sent on again."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return False
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def lean_transport(
    url: str, verify: ssl.SSLContext | bool, keepalive_s: float, transport: httpx.BaseTransport | None
) -> httpx.BaseTransport | None:
    """The transport an agent's httpx client gets for server ``url``: ``transport`` when
    one was given (tests), a ``LeanTransport`` where it applies (module docstring), else
    None (httpx's own)."""
    if transport is not None:
        return transport
    scheme = url.split("://", 1)[0].lower()
    if scheme not in ("http", "https") or (scheme == "https" and not isinstance(verify, ssl.SSLContext)):
        return None
    if _proxied():
        return None
    context = verify if isinstance(verify, ssl.SSLContext) else None
    return LeanTransport(context=context, keepalive_s=keepalive_s)


def _proxied() -> bool:
    """Whether the environment names a proxy httpx would use (it reads the same variables)."""
    return any(k in ("http", "https", "all") for k in urllib.request.getproxies())
