"""Clients with several servers (``gpufleet.failover``): the rule alone (order,
stickiness, cool-down, which failures move on, which requests are never sent twice, the
error), then each client against real loopback servers: the CLI's ``GpufleetClient``,
the agent's ``HttpTransport`` (and a real ``Agent``'s sync), the gateway's
``ServerSource``. A port bound but not listening is a real "connection refused"."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from typer.testing import CliRunner

from gpufleet.agent import HttpTransport, SimSpec, SimulatedProbe, make_agent
from gpufleet.agent.config import AgentConfig
from gpufleet.cli import app
from gpufleet.client import ClientError, GpufleetClient
from gpufleet.failover import Failure, Servers, Switch, failure_of, parse_urls, repeatable
from gpufleet.gateway.feed import FeedError, ServerSource

A, B, C = "http://a:8080", "http://b:8080", "http://c:8080"
REFUSED = Failure(reason="ConnectError: [Errno 111] Connection refused", sent=False)
TIMED_OUT = Failure(reason="ReadTimeout: timed out", sent=True)


# -- the rule --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ("http://a:8080", ("http://a:8080",)),
        ("http://a:8080/", ("http://a:8080",)),
        ("http://a:8080,https://b:8443/", ("http://a:8080", "https://b:8443")),
        (" http://a:8080 , http://b:8080,,", ("http://a:8080", "http://b:8080")),
        (["http://a:8080", "http://b:8080,http://a:8080"], ("http://a:8080", "http://b:8080")),
    ],
    ids=["one", "trailing-slash", "comma-list", "spaces-and-empties", "sequence-deduplicated"],
)
def test_parse_urls(given: str | list[str], want: tuple[str, ...]) -> None:
    assert parse_urls(given) == want


@pytest.mark.parametrize("given", ["", " , ", "a:8080", "http://a:8080,ftp://b"], ids=str)
def test_parse_urls_refuses(given: str) -> None:
    with pytest.raises(ValueError):
        parse_urls(given)


@pytest.mark.parametrize(
    ("events", "now", "want"),
    [
        ([], 0.0, [A, B, C]),
        ([("answered", B, 0.0)], 1.0, [B, A, C]),
        ([("failed", A, 0.0)], 1.0, [B, C, A]),
        ([("failed", A, 0.0)], 5.0, [A, B, C]),
        ([("answered", B, 0.0), ("failed", B, 1.0)], 2.0, [A, C, B]),
        ([("failed", A, 0.0), ("failed", C, 1.0)], 2.0, [B, A, C]),
        ([("failed", A, 0.0), ("answered", A, 1.0)], 1.5, [A, B, C]),
    ],
    ids=[
        "as-given",
        "sticky-to-the-last-answer",
        "failed-goes-last",
        "tried-again-after-the-cool-down",
        "sticky-one-failed",
        "all-but-one-cooling",
        "an-answer-ends-the-cool-down",
    ],
)
def test_order(events: list[tuple[str, str, float]], now: float, want: list[str]) -> None:
    clock = [0.0]
    servers = Servers([A, B, C], cool_down_s=5.0, clock=lambda: clock[0])
    for kind, url, at in events:
        clock[0] = at
        if kind == "answered":
            servers.note_answer(url)
        else:
            servers.note_failure(url, REFUSED)
    clock[0] = now
    assert servers.order() == want


@pytest.mark.parametrize(
    ("repeatable_", "failures", "want_tried", "want_stopped"),
    [
        (False, [REFUSED, REFUSED, REFUSED], [A, B, C], False),
        (False, [REFUSED, TIMED_OUT], [A, B], True),
        (False, [TIMED_OUT], [A], True),
        (True, [TIMED_OUT, TIMED_OUT, REFUSED], [A, B, C], False),
    ],
    ids=["never-sent-moves-on", "sent-post-stops", "sent-post-stops-at-once", "repeatable-moves-on"],
)
def test_walk_moves_on_only_when_safe(
    repeatable_: bool, failures: list[Failure], want_tried: list[str], want_stopped: bool
) -> None:
    walk = Servers([A, B, C]).walk(repeatable=repeatable_)
    got = iter(failures)
    for url in walk:
        walk.failed(url, next(got))
    assert ([u for u, _ in walk.tried], walk.stopped) == (want_tried, want_stopped)


@pytest.mark.parametrize(
    ("method", "want"),
    [("GET", True), ("put", True), ("DELETE", True), ("HEAD", True), ("POST", False), ("PATCH", False)],
    ids=lambda v: str(v),
)
def test_repeatable_methods(method: str, want: bool) -> None:
    assert repeatable(method) is want


@pytest.mark.parametrize(
    ("exc", "sent"),
    [
        (httpx.ConnectError("[Errno 111] Connection refused"), False),
        (httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED]"), False),
        (httpx.ConnectTimeout("timed out"), False),
        (httpx.PoolTimeout("timed out"), False),
        (httpx.ReadTimeout("timed out"), True),
        (httpx.WriteTimeout("timed out"), True),
        (httpx.ReadError("[Errno 104] Connection reset by peer"), True),
        (httpx.WriteError("[Errno 32] Broken pipe"), True),
        (httpx.RemoteProtocolError("Server disconnected without sending a response."), True),
    ],
    ids=["refused", "tls-handshake", "connect-timeout", "pool-timeout", "read-timeout", "write-timeout",
         "reset", "broken-pipe", "closed-without-answer"],
)  # fmt: skip
def test_httpx_failures(exc: httpx.HTTPError, sent: bool) -> None:
    failure = failure_of(exc)
    assert failure.sent is sent and failure.reason.startswith(type(exc).__name__ + ": ")


def test_switch_is_reported_once_with_its_reason() -> None:
    servers = Servers([A, B])
    walk = servers.walk(repeatable=False)
    assert walk.failed(A, REFUSED)
    assert walk.answered(B) == Switch(old=A, new=B, why=REFUSED.reason)
    assert servers.note_answer(B) is None and servers.current == B


@pytest.mark.parametrize(
    ("urls", "repeatable_", "failures", "want"),
    [
        ([A], False, [REFUSED], f"cannot reach server {A} ({REFUSED.reason})"),
        (
            [A, B],
            True,
            [REFUSED, TIMED_OUT],
            f"cannot reach any of 2 servers: {A} ({REFUSED.reason}); {B} ({TIMED_OUT.reason})",
        ),
        (
            [A, B, C],
            False,
            [REFUSED, TIMED_OUT],
            f"no answer from server {B} ({TIMED_OUT.reason}) after the request was sent; not sent "
            f"again to {C}, since {B} may have acted on it (check before sending it again); "
            f"tried before: {A} ({REFUSED.reason})",
        ),
    ],
    ids=["one-server", "every-server-named", "stopped-names-tried-and-untried"],
)
def test_error_names_the_servers(
    urls: list[str], repeatable_: bool, failures: list[Failure], want: str
) -> None:
    walk = Servers(urls).walk(repeatable=repeatable_)
    got = iter(failures)
    for url in walk:
        walk.failed(url, next(got))
    assert walk.message() == want


# -- real loopback servers -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    status: int = 200
    body: Any = None


HANG = "hang"
"""Read the request, then never answer (until the server is closed): a read timeout."""
DROP = "drop"
"""Read the request, then reset the connection: no answer at all."""


class Loopback:
    """A small HTTP server on 127.0.0.1 in a thread: ``routes`` maps "METHOD /path" to an
    ``Answer``, ``HANG`` or ``DROP`` (else 404); ``got`` lists the "METHOD /path" it read."""

    def __init__(self, routes: dict[str, Answer | str]) -> None:
        self.routes = routes
        self.got: list[str] = []
        self.release = threading.Event()
        loop = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                loop.handle(self)

            do_POST = do_PUT = do_GET

            def log_message(self, *args: object) -> None:
                return None

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def handle(self, req: BaseHTTPRequestHandler) -> None:
        req.rfile.read(int(req.headers.get("Content-Length") or 0))
        key = f"{req.command} {urlsplit(req.path).path}"
        self.got.append(key)
        what = self.routes.get(key, Answer(status=404, body={"detail": "no such route"}))
        if what == HANG:
            self.release.wait(10)
        if isinstance(what, str):
            req.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            req.close_connection = True
            return
        data = json.dumps(what.body).encode()
        req.send_response(what.status)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[dict[str, Answer | str]], Loopback]]:
    made: list[Loopback] = []

    def start(routes: dict[str, Answer | str]) -> Loopback:
        made.append(Loopback(routes))
        return made[-1]

    yield start
    for lb in made:
        lb.close()


@pytest.fixture
def refused() -> Iterator[str]:
    """A URL whose port is bound but not listening: every connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


JOB = {"id": 7, "name": "train"}
ME = {"id": 1, "name": "alice", "role": "user", "teams": []}


@pytest.mark.parametrize(
    ("method", "first", "moves_on"),
    [
        ("GET", "refused", True),
        ("POST", "refused", True),
        ("GET", HANG, True),
        ("POST", HANG, False),
        ("GET", DROP, True),
        ("POST", DROP, False),
        ("GET", Answer(status=503, body={"detail": "no upstream"}), True),
        ("POST", Answer(status=504, body={"detail": "upstream timed out"}), False),
    ],
    ids=["get-refused", "post-refused", "get-timed-out", "post-timed-out", "get-reset", "post-reset",
         "get-proxy-503", "post-proxy-504"],
)  # fmt: skip
def test_cli_client_fails_over(
    serve: Callable[[dict[str, Answer | str]], Loopback],
    refused: str,
    method: str,
    first: Answer | str,
    moves_on: bool,
) -> None:
    """A GET moves on after any failure; a POST /jobs only when it never reached the
    first server: one that timed out or was reset after sending is an error naming both."""
    path = "/users/me" if method == "GET" else "/jobs"
    key = f"{method} /v1{path}"
    one = refused if first == "refused" else serve({key: first}).url
    two = serve({key: Answer(body=ME if method == "GET" else JOB)})
    with GpufleetClient(f"{one},{two.url}", "t", timeout=0.3) as c:
        try:
            got: Any = c.request(method, path, json={"name": "train"} if method == "POST" else None)
        except ClientError as exc:
            got = exc.message
    if moves_on:
        assert (got, two.got, c.url) == (ME if method == "GET" else JOB, [key], two.url)
    else:
        assert two.got == [] and isinstance(got, str), got
        assert got.startswith(f"no answer from server {one} (") and f"not sent again to {two.url}" in got


def test_cli_client_names_every_server_when_all_fail(refused: str) -> None:
    other = refused.replace("http://127.0.0.1", "http://127.0.0.2")  # nothing listens there either
    with GpufleetClient([refused, other], "t", timeout=1.0) as c, pytest.raises(ClientError) as err:
        c.request("GET", "/users/me")
    msg = err.value.message
    assert msg.startswith("cannot reach any of 2 servers: ") and refused in msg and other in msg


@pytest.mark.parametrize(
    ("second", "code", "saved"),
    [("refused", 0, True), (Answer(status=401, body={"detail": "bad token"}), 1, False)],
    ids=["unreachable-saved-with-a-warning", "token-refused"],
)
def test_login_checks_every_server(
    serve: Callable[[dict[str, Answer | str]], Loopback],
    refused: str,
    tmp_path: Path,
    second: Answer | str,
    code: int,
    saved: bool,
) -> None:
    live = serve({"GET /v1/users/me": Answer(body=ME)})
    other = refused if second == "refused" else serve({"GET /v1/users/me": second}).url
    env = {"XDG_CONFIG_HOME": str(tmp_path), "HOME": str(tmp_path), "GPUFLEET_URL": "", "GPUFLEET_TOKEN": ""}
    res = CliRunner().invoke(app, ["login", f"{live.url},{other}", "--token", "t"], env=env)
    config = list(tmp_path.rglob("config.json"))
    assert (res.exit_code, bool(config)) == (code, saved), res.output
    if saved:
        assert json.loads(config[0].read_text())["url"] == f"{live.url},{other}"


SYNC_REPLY = {"node": "n1", "jobs": []}


def test_agent_sync_moves_to_the_next_server(
    serve: Callable[[dict[str, Answer | str]], Loopback], refused: str, tmp_path: Path
) -> None:
    """A real agent whose first server refuses syncs with the second, in the same sync."""
    live = serve({"POST /v1/nodes/n1/sync": Answer(body=SYNC_REPLY)})
    agent = make_agent(
        config=AgentConfig(node="n1", work_dir=tmp_path / "n1", address="127.0.0.1"),
        probe=SimulatedProbe(node="n1", spec=SimSpec(gpus=1)),
        transport=HttpTransport([refused, live.url], "t"),
    )
    try:
        assert agent.sync_once(), agent.stats.last_error
    finally:
        agent.close()
    assert live.got == ["POST /v1/nodes/n1/sync"]


def test_agent_long_poll_cut_resumes_on_the_next_server(
    serve: Callable[[dict[str, Answer | str]], Loopback],
) -> None:
    """The long-poll's server resets it: the same wait goes on at the next server, which
    answers at once (another boot's version), and the next sync goes there too."""
    dying = serve({"GET /v1/nodes/n1/wait": DROP, "POST /v1/nodes/n1/sync": Answer(body=SYNC_REPLY)})
    live = serve(
        {
            "GET /v1/nodes/n1/wait": Answer(body={"node": "n1", "version": "b.1"}),
            "POST /v1/nodes/n1/sync": Answer(body=SYNC_REPLY),
        }
    )
    transport = HttpTransport(f"{dying.url},{live.url}", "t")
    try:
        version = transport.wait("n1", "a.7", 1.0)
        reply = transport.sync("n1", {"gpus": []})
    finally:
        transport.close()
    assert (version, reply, transport.url) == ("b.1", SYNC_REPLY, live.url)
    assert (dying.got, live.got) == (
        ["GET /v1/nodes/n1/wait"],
        ["GET /v1/nodes/n1/wait", "POST /v1/nodes/n1/sync"],
    )


def test_gateway_feed_and_report_fail_over(
    serve: Callable[[dict[str, Answer | str]], Loopback], refused: str
) -> None:
    live = serve(
        {
            "GET /v1/gateway/endpoints": Answer(body={"at": 1.0, "services": []}),
            "POST /v1/gateway/report": Answer(body={}),
        }
    )

    async def run() -> float:
        source = ServerSource([refused, live.url], "t")
        try:
            feed = await source.load()
            await source.report({"gateway": "g1", "services": {}})
        finally:
            await source.aclose()
        return feed.at

    assert asyncio.run(run()) == 1.0
    assert live.got == ["GET /v1/gateway/endpoints", "POST /v1/gateway/report"]


def test_gateway_feed_error_names_every_server(refused: str) -> None:
    async def run() -> str:
        source = ServerSource(f"{refused},{refused.replace('127.0.0.1', '127.0.0.2')}", "t")
        try:
            await source.load()
        except FeedError as exc:
            return str(exc)
        finally:
            await source.aclose()
        return ""

    assert asyncio.run(run()).startswith("cannot reach any of 2 servers: ")
