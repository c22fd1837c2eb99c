"""Strangers against a running gateway (issue 29, finding 6's connection half;
``gpufleet.netguard``): connections still sending their head are timed out, idle ones
too, and one address cannot hold more than its share of connections, while callers
keep getting answers."""

from __future__ import annotations

import json
import resource
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from server.conftest import free_port

TIMEOUT_S = 1.0
CAP = 20
STRANGER = "127.0.0.2"
"""The attackers' address (loopback too, on Linux); callers come from 127.0.0.1."""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    feed = tmp_path_factory.mktemp("gw") / "feed.json"
    feed.write_text(json.dumps({"services": []}))
    port = free_port()
    limits = ("--header-timeout", str(TIMEOUT_S), "--idle-timeout", str(TIMEOUT_S))
    args = ["--endpoints-file", str(feed), "--port", str(port), *limits, "--max-conns-per-address", str(CAP)]
    args.append("--metrics-public")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "gateway", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_default_open_files,
    )
    try:
        _ready(f"http://127.0.0.1:{port}", proc)
        yield "127.0.0.1", port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _default_open_files() -> None:
    """Start the gateway with the common default soft limit (1,024 open files)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))


def _ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while True:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        try:
            if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.1)


def _open(where: tuple[str, int], n: int) -> list[socket.socket]:
    return [socket.create_connection(where, timeout=5, source_address=(STRANGER, 0)) for _ in range(n)]


def _closed(s: socket.socket, within_s: float) -> bytes | None:
    """What came before the gateway closed ``s``; None while it stays open."""
    s.settimeout(within_s)
    got = b""
    try:
        while chunk := s.recv(4096):
            got += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return got


def _answers(where: tuple[str, int], n: int = 10) -> list[int]:
    with httpx.Client(base_url=f"http://{where[0]}:{where[1]}", timeout=5) as c:
        return [
            c.get("/healthz").status_code if i % 2 else c.get("/s/nosuch/x").status_code for i in range(n)
        ]


def test_slowloris_heads_are_timed_out(gateway: tuple[str, int]) -> None:
    socks = _open(gateway, 10)
    try:
        start = time.monotonic()
        for s in socks:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        for _ in range(2):  # a header line now and then, never the end of the head
            time.sleep(0.3)
            for s in socks:
                s.sendall(b"X-a: b\r\n")
        assert _answers(gateway) == [404, 200] * 5
        got = [_closed(s, TIMEOUT_S + 2) for s in socks]
        took = time.monotonic() - start
    finally:
        for s in socks:
            s.close()
    assert all(g is not None and g.startswith(b"HTTP/1.1 408 ") for g in got), got
    assert took < TIMEOUT_S + 2.5, took
    assert _metric(gateway, "gpufleet_gateway_connections_timed_out_total", reason="header") >= 10


def test_idle_connections_from_one_address_are_capped_and_closed(gateway: tuple[str, int]) -> None:
    socks = _open(gateway, CAP * 3)
    try:
        time.sleep(0.3)
        closed, _, _ = select.select(socks, [], [], 0.1)  # readable: the gateway closed it (EOF)
        assert _answers(gateway) == [404, 200] * 5  # from another address: served
        start = time.monotonic()
        later: list[socket.socket] = []
        while len(later) < len(socks) and time.monotonic() - start < TIMEOUT_S + 2:
            later, _, _ = select.select(socks, [], [], 0.1)
    finally:
        for s in socks:
            s.close()
    assert len(closed) == 2 * CAP  # the first CAP stay, the rest are closed at once
    assert len(later) == len(socks)  # and the ones that stayed went idle: closed
    assert _metric(gateway, "gpufleet_gateway_connections_refused_total") >= 2 * CAP
    assert _metric(gateway, "gpufleet_gateway_connections_timed_out_total", reason="idle") >= CAP


def test_the_open_files_limit_is_raised(gateway: tuple[str, int]) -> None:
    """Started with 1,024 open files (the soft limit), the gateway lifts it to the hard one."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limits = Path(f"/proc/{_listener_pid(gateway[1])}/limits").read_text()
    line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
    assert line.split()[3:5] == [str(hard)] * 2, line


def _metric(where: tuple[str, int], name: str, **labels: str) -> float:
    text = httpx.get(f"http://{where[0]}:{where[1]}/metrics", timeout=5).text
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def _listener_pid(port: int) -> int:
    import psutil

    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            return int(conn.pid)
    raise AssertionError(f"nothing listens on {port}")
