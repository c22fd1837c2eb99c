"""The agent's ``http.client`` transport under httpx (``agent/lean.py``), against a
small real server on loopback whose behaviour each test sets: kept connections are
reused, retired when the server closed them, said ``Connection: close`` or idled past
the keep-alive; failures are httpx's errors, with "never sent" where it was not; where a
proxy or httpx's default trust store applies, httpx's own transport stays."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from gpufleet.agent.lean import LeanTransport, lean_transport
from gpufleet.failover import failure_of


@dataclass
class _Server:
    """Answers each request ``{"n": count}``; ``close_after``: closes a connection that
    many seconds after an answer (without saying so); ``say_close``: answers with
    ``Connection: close``; ``silent``: never answers."""

    close_after: float | None = None
    say_close: bool = False
    silent: bool = False
    peers: list[int] = field(default_factory=list)
    sock: socket.socket = field(default_factory=socket.socket)

    def start(self) -> int:
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()
        return int(self.sock.getsockname()[1])

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, peer[1]), daemon=True).start()

    def _serve(self, conn: socket.socket, port: int) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(rest) < length:
                    rest += conn.recv(65536)
                buf = rest[length:]
                if self.silent:
                    time.sleep(5)
                    return
                self.peers.append(port)
                body = b'{"n":%d}' % len(self.peers)
                extra = b"Connection: close\r\n" if self.say_close else b""
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
                    % (len(body), extra, body)
                )
                if self.say_close:
                    return
                if self.close_after is not None:
                    time.sleep(self.close_after)
                    return

    def stop(self) -> None:
        self.sock.close()


@pytest.fixture
def serve() -> Iterator[list[_Server]]:
    started: list[_Server] = []
    yield started
    for s in started:
        s.stop()


def _client(port: int, *, keepalive_s: float = 15.0, timeout: float = 5.0) -> httpx.Client:
    transport = LeanTransport(context=None, keepalive_s=keepalive_s)
    return httpx.Client(base_url=f"http://127.0.0.1:{port}", transport=transport, timeout=timeout)


def test_a_kept_connection_is_reused(serve: list[_Server]) -> None:
    srv = _Server()
    serve.append(srv)
    port = srv.start()
    with _client(port) as c:
        answers = [c.post("/v1/nodes/a/renew", json={"lease": "x"}).json()["n"] for _ in range(5)]
    assert answers == [1, 2, 3, 4, 5]
    assert len(set(srv.peers)) == 1  # one connection for all five


def test_a_connection_the_server_closed_is_not_sent_on(serve: list[_Server]) -> None:
    srv = _Server(close_after=0.05)
    serve.append(srv)
    port = srv.start()
    with _client(port) as c:
        for _ in range(3):
            assert c.get("/x").status_code == 200
            time.sleep(0.2)  # the server has closed it by now (its FIN is waiting)
    assert len(set(srv.peers)) == 3  # a new connection each time, no failed request


def test_connection_close_and_the_keepalive_retire_a_connection(serve: list[_Server]) -> None:
    closing = _Server(say_close=True)
    kept = _Server()
    serve += [closing, kept]
    with _client(closing.start()) as c:
        assert [c.get("/x").status_code for _ in range(3)] == [200, 200, 200]
    assert len(set(closing.peers)) == 3
    with _client(kept.start(), keepalive_s=0.1) as c:
        c.get("/x")
        time.sleep(0.3)  # idle past the keep-alive
        c.get("/x")
        c.get("/x")  # at once: kept
    assert len(set(kept.peers)) == 2


def test_failures_are_httpx_errors_that_say_whether_the_request_went_out(serve: list[_Server]) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there
    with _client(port) as c, pytest.raises(httpx.ConnectError) as refused:
        c.get("/x")
    assert not failure_of(refused.value).sent
    silent = _Server(silent=True)
    serve.append(silent)
    with _client(silent.start(), timeout=0.3) as c, pytest.raises(httpx.ReadTimeout) as late:
        c.post("/v1/nodes/a/sync", json={})
    assert failure_of(late.value).sent


def test_where_it_applies() -> None:
    given = httpx.MockTransport(lambda r: httpx.Response(200))
    ctx = ssl.create_default_context()
    assert lean_transport("http://a:1", True, 15.0, given) is given
    assert isinstance(lean_transport("http://a:1", True, 15.0, None), LeanTransport)
    assert isinstance(lean_transport("https://a:1", ctx, 15.0, None), LeanTransport)
    assert lean_transport("https://a:1", True, 15.0, None) is None  # httpx's trust store: its transport


def test_an_environment_proxy_keeps_httpx_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    assert lean_transport("http://a:1", True, 15.0, None) is None
