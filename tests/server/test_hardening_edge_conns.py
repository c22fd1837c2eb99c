"""Strangers on the network against a running server (issue 29, finding 3): stalled
request bodies, stalled request heads and idle connections hold no lane seat and are
closed after their timeout (``gpufleet.netguard``, ``lanes.Admission``), while a valid
user's requests all succeed promptly."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from gpufleet.netguard import GuardLimits, GuardStats, uvicorn_options
from server.conftest import Server, make_pool, make_team, make_user, ok, start_server, stop_server
from server.playnode import metric

TIMEOUT_S = 1.5
"""The server's header, body and idle timeouts here (``--header-timeout``...)."""
KEEP_S = 4.0
"""Its keep-alive (``--keep-alive``): how long an answered connection may wait."""
STALLED = 8
"""Twice the user lane's seats (``--user-lane 4``, the default)."""


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    url = f"sqlite:///{tmp_path_factory.mktemp('edge') / 'gpufleet.db'}"
    timeouts = ("--header-timeout", str(TIMEOUT_S), "--body-timeout", str(TIMEOUT_S))
    srv = start_server(url, extra=(*timeouts, "--idle-timeout", str(TIMEOUT_S), "--keep-alive", str(KEEP_S)))
    yield srv
    stop_server(srv)


@contextlib.contextmanager
def stalled(srv: Server, first: bytes, n: int = STALLED) -> Iterator[list[socket.socket]]:
    """``n`` connections that sent ``first`` and then nothing more."""
    where = urlsplit(srv.url)
    socks = []
    try:
        for _ in range(n):
            s = socket.create_connection((where.hostname, where.port), timeout=10)
            if first:
                s.sendall(first)
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


def closed_with(s: socket.socket, within_s: float) -> bytes:
    """What the server sent before it closed ``s`` (fails if it stays open)."""
    s.settimeout(within_s)
    got = b""
    while chunk := s.recv(4096):
        got += chunk
    return got


def user_requests(srv: Server, token: str, pool: str, team: str) -> list[float]:
    """A valid user's reads and submissions, each's seconds."""
    took = []
    with srv.client(token) as c:
        for i in range(6):
            start = time.monotonic()
            if i % 2:
                ok(c.post("/jobs", json={"command": ["true"], "pool": pool, "team": team}), 201)
            else:
                ok(c.get("/jobs"))
            took.append(time.monotonic() - start)
    return took


def _user(srv: Server) -> tuple[str, str, str]:
    team = make_team(srv)
    return make_user(srv, team=team), make_pool(srv), team


BODY_HEAD = (
    b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
)
"""The issue's attack: a submission's head promising 100,000 bytes, and one byte."""


def test_stalled_bodies_hold_no_seat_and_are_closed(guarded: Server) -> None:
    token, pool, team = _user(guarded)
    before = metric(guarded, "gpufleet_http_connections_timed_out_total", reason="body")
    with stalled(guarded, BODY_HEAD) as socks:
        time.sleep(0.3)  # they are in: with the old admission each held a user-lane seat
        took = user_requests(guarded, token, pool, team)
        answers = [closed_with(s, TIMEOUT_S + 3) for s in socks]
    assert max(took) < 1.0, took
    assert all(a.startswith(b"HTTP/1.1 408 ") for a in answers), answers
    after = metric(guarded, "gpufleet_http_connections_timed_out_total", reason="body")
    assert after - before >= STALLED


def test_slow_bodies_are_cut_at_the_rate_floor(guarded: Server) -> None:
    """A byte a second never lets the body timeout run out; the rate floor (1 KiB/s on
    average once 5 s have passed) ends it."""
    got = b""
    with stalled(guarded, BODY_HEAD, n=1) as (s,):
        s.settimeout(1.0)  # the body's pace: a byte, then up to a second for an answer
        start = time.monotonic()
        while time.monotonic() - start < 15:
            try:
                s.sendall(b" ")
                got = s.recv(4096)
                break
            except TimeoutError:
                continue
            except OSError:
                break
        took = time.monotonic() - start
    assert got.startswith(b"HTTP/1.1 408 "), got
    assert 5 <= took < 8, took


@pytest.mark.parametrize(
    "first",
    [
        pytest.param(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\n", id="head-never-ends"),
        pytest.param(b"GET /v1/jo", id="request-line-never-ends"),
        pytest.param(b"", id="idle-connection"),
    ],
)
def test_stalled_heads_and_idle_connections_are_closed(guarded: Server, first: bytes) -> None:
    token, pool, team = _user(guarded)
    with stalled(guarded, first) as socks:
        time.sleep(0.3)
        took = user_requests(guarded, token, pool, team)
        start = time.monotonic()
        answers = [closed_with(s, TIMEOUT_S + 3) for s in socks]
    assert max(took) < 1.0, took
    assert time.monotonic() - start < TIMEOUT_S + 3
    assert all(a == b"" if not first else a.startswith(b"HTTP/1.1 408 ") for a in answers), answers


def _response(s: socket.socket) -> bytes:
    """One whole HTTP response from ``s`` (its head and ``content-length`` bytes of body:
    they may come in separate reads)."""
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(4096)
        assert chunk, got
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    size = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < size:
        chunk = s.recv(4096)
        assert chunk, got
        body += chunk
    assert len(body) == size, body  # nothing after it: the next read is the next answer's
    return head


def test_an_answered_connection_is_kept_for_the_keep_alive_then_closed(guarded: Server) -> None:
    """A fresh connection gets ``--idle-timeout`` for its first byte; once answered it may
    wait ``--keep-alive`` for the next request (an agent's renewals, 10 s apart, reuse
    one connection), and is closed after that, with no answer."""
    with stalled(guarded, b"GET /v1/healthz HTTP/1.1\r\nHost: x\r\n\r\n", n=1) as (s,):
        s.settimeout(5)
        assert _response(s).startswith(b"HTTP/1.1 200 ")
        time.sleep(TIMEOUT_S + 1.0)  # past the idle timeout: still open
        s.sendall(b"GET /v1/healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _response(s).startswith(b"HTTP/1.1 200 ")
        start = time.monotonic()
        assert closed_with(s, KEEP_S + 3) == b""
        took = time.monotonic() - start
    assert KEEP_S - 0.5 <= took < KEEP_S + 2, took
    # a head begun on a kept connection has --header-timeout, not what is left of the
    # keep-alive, counted from its first byte (it may begin after longer than the header
    # timeout), and gets its 408 as on a fresh connection
    for idle in (0.0, TIMEOUT_S + 0.5):
        with stalled(guarded, b"GET /v1/healthz HTTP/1.1\r\nHost: x\r\n\r\n", n=1) as (s,):
            s.settimeout(5)
            assert _response(s).startswith(b"HTTP/1.1 200 ")
            time.sleep(idle)
            s.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n")
            start = time.monotonic()
            got = closed_with(s, KEEP_S + 3)
            took = time.monotonic() - start
        assert got.startswith(b"HTTP/1.1 408 "), (idle, got)
        assert TIMEOUT_S - 0.5 <= took < TIMEOUT_S + 1.5, (idle, took)


@pytest.mark.parametrize(
    "limits",
    [
        pytest.param({"header_timeout_s": 0}, id="no-header-time"),
        pytest.param({"body_timeout_s": -1}, id="negative-body-time"),
        pytest.param({"min_body_rate": -1}, id="negative-rate"),
        pytest.param({"max_per_address": -1}, id="negative-cap"),
        pytest.param({"keepalive_s": 0}, id="no-keep-alive-time"),
    ],
)
def test_guard_limits_refuse_nonsense(limits: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        GuardLimits(**limits)  # type: ignore[arg-type]


def test_the_guarded_protocol_is_uvicorns_own_subclass() -> None:
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    stats = GuardStats()
    options = uvicorn_options(GuardLimits(idle_timeout_s=7.4), stats, base=H11Protocol)
    assert issubclass(options["http"], H11Protocol) and options["timeout_keep_alive"] == 7
    assert uvicorn_options(GuardLimits(idle_timeout_s=5, keepalive_s=20), stats)["timeout_keep_alive"] == 20
    assert issubclass(uvicorn_options(GuardLimits(), stats)["http"], HttpToolsProtocol)
