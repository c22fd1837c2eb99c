"""``gpufleet.litehttp``, the CLI's standard-library HTTP, against loopback servers: a kept
connection the server closed while idle is replaced before use (no request lost, none
sent twice), query and JSON bodies arrive as httpx sent them, and its failures say
whether the request may have reached the server (``failover``'s rule)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from gpufleet.litehttp import LiteError, LiteHTTP


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[tuple[str, str, Any, int]]] = []
    """(method, path with query, JSON body, the client's port: one per connection)"""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.seen.append((self.command, self.path, body, self.client_address[1]))
        data = json.dumps({"ok": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True  # closes after answering, without saying so: idle-closed

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Handler.seen = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def client(timeout: float = 5.0) -> LiteHTTP:
    return LiteHTTP(
        headers={"Authorization": "Bearer t"}, timeout=timeout, connect_timeout=timeout, ca_file=None
    )


def test_a_connection_closed_while_idle_is_replaced_and_bodies_arrive(server: str) -> None:
    http = client()
    first = http.request("GET", f"{server}/v1/jobs", params={"state": "PENDING,RUNNING", "limit": 100})
    time.sleep(0.05)  # the server has closed that connection by now
    second = http.request("POST", f"{server}/v1/jobs", json={"command": ["true"], "name": "é"})
    http.close()
    assert first.status_code == second.status_code == 200 and second.json() == {"ok": True}
    (m1, p1, b1, port1), (m2, p2, b2, port2) = Handler.seen
    assert (m1, p1, b1) == ("GET", "/v1/jobs?state=PENDING%2CRUNNING&limit=100", None)
    assert (m2, p2, b2) == ("POST", "/v1/jobs", {"command": ["true"], "name": "é"})
    assert port1 != port2 and len(Handler.seen) == 2  # a new connection, each request once


def test_failures_say_whether_the_request_was_sent() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens once closed
    with pytest.raises(LiteError) as refused:
        client().request("GET", f"http://127.0.0.1:{closed}/v1/jobs")
    assert not refused.value.failure.sent and refused.value.failure.reason.startswith("ConnectError")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # accepts (the kernel does) and never answers
    try:
        started = time.monotonic()
        with pytest.raises(LiteError) as timed_out:
            client(timeout=0.3).request(
                "POST", f"http://127.0.0.1:{silent.getsockname()[1]}/v1/jobs", json={}
            )
        assert timed_out.value.failure.sent and timed_out.value.failure.reason.startswith("ReadTimeout")
        assert time.monotonic() - started < 5
    finally:
        silent.close()


def _raw_server(answer: bytes) -> tuple[socket.socket, str]:
    """A server that reads one request and writes ``answer`` as it is, then closes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.getsockname()[1]}"


@pytest.mark.parametrize(
    ("answer", "body"),
    [
        pytest.param(
            b"HTTP/1.1 100 Continue\r\n\r\n"
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n"
            b"X-A: 1\r\n\r\n4;ext=1\r\n[1, \r\n3\r\n2]\n\r\n0\r\nTrailer: x\r\n\r\n",
            [1, 2],
            id="1xx-then-chunked",
        ),
        pytest.param(b"HTTP/1.0 200 OK\r\nX-A: 1\r\n\r\n[1, 2]", [1, 2], id="to-the-end"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nX-A: 1\r\nConnection: close\r\n\r\n[1, 2]ignored",
            [1, 2],
            id="content-length",
        ),
    ],
)
def test_an_answer_is_read_by_length_chunks_or_to_the_end(answer: bytes, body: Any) -> None:
    srv, url = _raw_server(answer)
    try:
        http = client()
        got = http.request("GET", f"{url}/v1/x")
        assert (got.status_code, got.json(), got.headers["x-a"]) == (200, body, "1")
        assert not http._conns  # each of these ends the connection: none is kept
    finally:
        srv.close()


@pytest.mark.parametrize(
    "answer",
    [
        b"",
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n[1]",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
    ids=["closed", "not-http", "short", "bad-chunk"],
)
def test_a_broken_answer_is_a_failure_after_sending(answer: bytes) -> None:
    srv, url = _raw_server(answer)
    try:
        with pytest.raises(LiteError) as failed:
            client().request("POST", f"{url}/v1/jobs", json={})
        assert failed.value.failure.sent
    finally:
        srv.close()


def test_the_config_file_is_where_platformdirs_puts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``client.config_file`` writes out the XDG rule on Linux instead of importing
    platformdirs: the same path, with and without XDG_CONFIG_HOME."""
    import os

    import platformdirs

    from gpufleet.client import config_file

    for xdg in ("/tmp/xdg-here", None):
        if xdg is None:
            monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
        else:
            monkeypatch.setenv("XDG_CONFIG_HOME", xdg)
        assert config_file() == os.path.join(platformdirs.user_config_dir("gpufleet"), "config.json")
