"""The gateway as a black box: a real uvicorn serving ``create_app`` on a loopback
port, real aiohttp upstream replicas, a ``StaticSource`` feed; driven with httpx and
the ``openai`` client. Everything server-side shares one event loop in a thread."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import httpx
import openai
import pytest
import uvicorn
from aiohttp import web

from gpufleet.gateway import Endpoint, Feed, GatewayConfig, Service, StaticSource, create_app
from gpufleet.ratelimit import Rate

T = TypeVar("T")
TOKEN = "gf_svc_test_token_0123456789abcdef"
DIGEST = hashlib.sha256(TOKEN.encode()).hexdigest()
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SCRAPE = {"Authorization": "Bearer gf_gateway_metrics_test_token"}
SCRAPE_DIGEST = hashlib.sha256(b"gf_gateway_metrics_test_token").hexdigest()


class Background:
    """An event loop in a thread, for the servers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@dataclass
class Replicas:
    urls: dict[str, str]
    seen: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    """(replica, path, what it saw) for every request, in arrival order."""


def _upstream(name: str, replicas: Replicas) -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        saw = {
            "replica": name,
            "method": request.method,
            "path_qs": request.raw_path,
            "headers": dict(request.headers),
            "body": body.decode(),
        }
        replicas.seen.append((name, request.path, saw))
        return web.json_response(saw, headers={"X-Upstream": name, "Keep-Alive": "timeout=5"})

    async def slow(request: web.Request) -> web.Response:
        replicas.seen.append((name, request.path, {}))
        await asyncio.sleep(1.0)
        return web.json_response({"replica": name})

    async def sse(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(3):
            if i:
                await asyncio.sleep(0.5)
            await resp.write(f"data: {i}\n\n".encode())
        await resp.write_eof()
        return resp

    async def endless(request: web.Request) -> web.StreamResponse:
        """64 KiB chunks for as long as someone takes them; says when it was stopped."""
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        try:
            while True:
                await resp.write(b"x" * 65_536)
        finally:
            replicas.seen.append((name, "endless-stopped", {}))

    async def status(request: web.Request) -> web.Response:
        return web.Response(status=int(request.match_info["code"]))

    async def chat(request: web.Request) -> web.StreamResponse:
        req = await request.json()
        replicas.seen.append((name, request.path, {"headers": dict(request.headers)}))
        base = {"id": "c1", "created": 0, "model": req["model"]}
        if not req.get("stream"):
            message = {"role": "assistant", "content": f"hello from {name}"}
            return web.json_response(
                base
                | {
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in ("hello", " from", f" {name}"):
            chunk = base | {
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
            }
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_route("*", "/echo/{tail:.*}", echo)
    app.router.add_get("/slow", slow)
    app.router.add_get("/sse", sse)
    app.router.add_get("/endless", endless)
    app.router.add_get("/status/{code}", status)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def bg() -> Iterator[Background]:
    b = Background()
    yield b
    b.close()


@pytest.fixture(scope="module")
def replicas(bg: Background) -> Iterator[Replicas]:
    reps = Replicas(urls={})
    runners = []

    async def start(name: str) -> None:
        runner = web.AppRunner(_upstream(name, reps), access_log=None)
        await runner.setup()
        port = _free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        reps.urls[name] = f"http://127.0.0.1:{port}"

    for name in ("a", "b"):
        bg.run(start(name))
    reps.urls["dead"] = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    yield reps
    for r in runners:
        bg.run(r.cleanup())


def feed(
    replicas: Replicas,
    *names: str,
    at: float = 1.0,
    rate: Rate | None = None,
    svc: str = "llm",
    protocol: str = "http",
) -> Feed:
    """A feed of one service (``http``: the gateway's own errors are problem+json)."""
    eps = tuple(Endpoint(id=f"7.{n}", url=replicas.urls[n], job_id=7) for n in names)
    return Feed(
        at=at,
        services={
            svc: Service(name=svc, protocol=protocol, tokens=frozenset({DIGEST}), rate=rate, endpoints=eps)
        },
    )


@dataclass
class Running:
    url: str
    source: StaticSource
    client: httpx.Client

    def wait_for_feed(self, at: float) -> None:
        deadline = time.monotonic() + 5
        while self.client.get("/readyz").json()["feed_at"] != at:
            assert time.monotonic() < deadline, "the gateway never took the new feed"
            time.sleep(0.02)

    def metric(self, line_start: str) -> float:
        for line in self.client.get("/metrics", headers=SCRAPE).text.splitlines():
            if line.startswith(line_start):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@contextmanager
def gateway(
    bg: Background, first: Feed, config: GatewayConfig | None = None, source: StaticSource | None = None
) -> Iterator[Running]:
    source = source or StaticSource(first)
    config = replace(config or GatewayConfig(refresh_s=0.02), metrics_tokens=frozenset({SCRAPE_DIGEST}))
    app = create_app(source, config=config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_level="warning", http="httptools"))
    done = asyncio.run_coroutine_threadsafe(server.serve(sockets=[sock]), bg.loop)
    deadline = time.monotonic() + 5
    while not server.started:
        assert time.monotonic() < deadline and not done.done(), "the gateway did not start"
        time.sleep(0.01)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with httpx.Client(base_url=url, timeout=10) as client:
        try:
            yield Running(url, source, client)
        finally:
            server.should_exit = True
            done.result(10)
            sock.close()


def test_routes_forwards_and_strips(bg: Background, replicas: Replicas) -> None:
    with gateway(bg, feed(replicas, "a", "b")) as gw:
        r = gw.client.post(
            "/s/llm/echo/a%20b?x=1&y=%2F",
            content=b"hello",
            headers=AUTH
            | {"X-Request-Id": "req-42", "X-Custom": "v", "Connection": "keep-alive", "TE": "trailers"},
        )
        assert r.status_code == 200, r.text
        saw = r.json()
        assert (saw["method"], saw["path_qs"], saw["body"]) == ("POST", "/echo/a%20b?x=1&y=%2F", "hello")
        sent = {k.lower(): v for k, v in saw["headers"].items()}
        assert "authorization" not in sent and "te" not in sent
        assert sent["x-custom"] == "v" and sent["x-request-id"] == "req-42"
        assert sent["x-forwarded-for"] == "127.0.0.1"
        assert r.headers["x-request-id"] == "req-42"
        assert r.headers["x-gpufleet-replica"] == f"7.{saw['replica']}"
        assert r.headers["x-upstream"] == saw["replica"] and "keep-alive" not in r.headers
        # no id, or a silly one: a new one, the same upstream and back
        for sent_id in ({}, {"X-Request-Id": "bad id\twith spaces"}, {"X-Request-Id": "x" * 200}):
            r = gw.client.get("/s/llm/echo/", headers=AUTH | sent_id)
            rid = r.headers["x-request-id"]
            assert (
                len(rid) == 24
                and rid == {k.lower(): v for k, v in r.json()["headers"].items()}["x-request-id"]
            )
        # least in flight + round robin: sequential requests alternate
        got = [gw.client.get("/s/llm/echo/", headers=AUTH).headers["x-gpufleet-replica"] for _ in range(4)]
        assert sorted(got) == ["7.a", "7.a", "7.b", "7.b"]


@pytest.mark.parametrize(
    ("path", "headers", "want", "retry_after"),
    [
        ("/s/llm/echo/", {}, 401, None),
        ("/s/llm/echo/", {"Authorization": "Bearer nope"}, 401, None),
        ("/s/llm/echo/", {"Authorization": f"Basic {TOKEN}"}, 401, None),
        ("/s/other/echo/", AUTH, 404, None),
        ("/s/empty/echo/", AUTH, 503, "1"),
        ("/nowhere", AUTH, 404, None),
    ],
    ids=["no token", "bad token", "not bearer", "unknown service", "no replica", "unknown route"],
)
def test_problems(
    bg: Background, replicas: Replicas, path: str, headers: dict[str, str], want: int, retry_after: str | None
) -> None:
    first = feed(replicas, "a")
    services = dict(first.services) | {"empty": Service(name="empty", tokens=frozenset({DIGEST}))}
    with gateway(bg, Feed(at=1.0, services=services)) as gw:
        r = gw.client.get(path, headers=headers | {"X-Request-Id": "p-1"})
        _assert_problem(r, want, request_id="p-1" if path.startswith("/s/") else None)
        assert r.headers.get("retry-after") == retry_after
        if want == 401:
            assert r.headers["www-authenticate"] == "Bearer"


def _assert_problem(r: httpx.Response, status: int, request_id: str | None = "") -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["status"] == status and body["type"] == "about:blank" and body["title"] and body["detail"]
    if request_id is not None:
        assert r.headers["x-request-id"] == request_id if request_id else r.headers["x-request-id"]


def test_rate_limit_and_body_limit(bg: Background, replicas: Replicas) -> None:
    config = GatewayConfig(refresh_s=0.02, max_body_bytes=1000)
    with gateway(bg, feed(replicas, "a", rate=Rate(burst=2, per_s=0.01)), config) as gw:
        assert [gw.client.get("/s/llm/echo/", headers=AUTH).status_code for _ in range(2)] == [200, 200]
        r = gw.client.get("/s/llm/echo/", headers=AUTH)
        _assert_problem(r, 429)
        assert int(r.headers["retry-after"]) >= 99
    with gateway(bg, feed(replicas, "a"), config) as gw:
        _assert_problem(gw.client.post("/s/llm/echo/", headers=AUTH, content=b"x" * 1001), 413)

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it comes
            yield from (b"x" * 600, b"x" * 600)

        _assert_problem(gw.client.post("/s/llm/echo/", headers=AUTH, content=chunks()), 413)
        assert gw.client.post("/s/llm/echo/", headers=AUTH, content=b"x" * 1000).status_code == 200


def test_dead_replica_is_retried_elsewhere_and_ejected(bg: Background, replicas: Replicas) -> None:
    with gateway(bg, feed(replicas, "dead", "a")) as gw:
        for i in range(8):
            method = "POST" if i % 2 else "GET"  # a replica never reached: any method is resent
            r = gw.client.request(method, "/s/llm/echo/", headers=AUTH, content=b"body" if i % 2 else None)
            assert r.status_code == 200 and r.headers["x-gpufleet-replica"] == "7.a"
        assert gw.metric('gpufleet_gateway_ejections_total{service="llm"}') == 1.0
        assert gw.metric("gpufleet_gateway_retries_total") == 1.0  # ejected after the first
        assert gw.metric('gpufleet_gateway_requests_total{code="200",service="llm"}') == 8.0
    with gateway(bg, feed(replicas, "dead")) as gw:  # nowhere else to go: 502
        _assert_problem(gw.client.get("/s/llm/echo/", headers=AUTH), 502)


def test_5xx_passes_through_and_ejects_after_five(bg: Background, replicas: Replicas) -> None:
    with gateway(bg, feed(replicas, "a", "b")) as gw:
        codes = [gw.client.get("/s/llm/status/500", headers=AUTH).status_code for _ in range(10)]
        assert codes == [500] * 10
        assert gw.metric('gpufleet_gateway_ejections_total{service="llm"}') == 1.0  # the cap: one of two


def test_a_busy_replica_503_is_passed_on_and_never_ejected(bg: Background, replicas: Replicas) -> None:
    """Issue 30, finding 6: a 503 is a replica saying it is busy (or loading); ejecting it
    would push its load onto the others until they look busy too."""
    with gateway(bg, feed(replicas, "a", "b")) as gw:
        codes = [gw.client.get("/s/llm/status/503", headers=AUTH).status_code for _ in range(12)]
        assert codes == [503] * 12
        assert gw.metric('gpufleet_gateway_ejections_total{service="llm"}') == 0.0


def test_sse_chunks_pass_through_as_they_come(bg: Background, replicas: Replicas) -> None:
    with gateway(bg, feed(replicas, "a")) as gw:
        t0 = time.monotonic()
        arrivals = []
        with gw.client.stream("GET", "/s/llm/sse", headers=AUTH) as r:
            assert r.headers["content-type"] == "text/event-stream"
            for chunk in r.iter_raw():
                arrivals.append((time.monotonic() - t0, chunk))
        assert b"".join(c for _, c in arrivals) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        assert arrivals[0][0] < 0.4 and arrivals[-1][0] >= 1.0


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_openai_client(bg: Background, replicas: Replicas, stream: bool) -> None:
    with gateway(bg, feed(replicas, "a")) as gw:
        client = openai.OpenAI(base_url=f"{gw.url}/s/llm/v1", api_key=TOKEN, max_retries=0)
        messages: Any = [{"role": "user", "content": "hi"}]
        if stream:
            parts = client.chat.completions.create(model="m", messages=messages, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in parts)
        else:
            done = client.chat.completions.create(model="m", messages=messages)
            text = done.choices[0].message.content or ""
        assert text == "hello from a"
        headers = {k.lower() for k in replicas.seen[-1][2]["headers"]}
        assert "authorization" not in headers
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{gw.url}/s/llm/v1", api_key="wrong", max_retries=0).models.list()


def test_replica_leaving_the_feed_finishes_its_requests(bg: Background, replicas: Replicas) -> None:
    with gateway(bg, feed(replicas, "a", "b")) as gw:
        slow: dict[str, httpx.Response] = {}
        n = len(replicas.seen)
        t = threading.Thread(target=lambda: slow.update(r=httpx.get(f"{gw.url}/s/llm/slow", headers=AUTH)))
        t.start()
        while len(replicas.seen) == n:
            time.sleep(0.01)
        busy = replicas.seen[n][0]
        other = "b" if busy == "a" else "a"
        gw.source.set(feed(replicas, other, at=2.0))
        gw.wait_for_feed(2.0)
        got = {gw.client.get("/s/llm/echo/", headers=AUTH).headers["x-gpufleet-replica"] for _ in range(4)}
        assert got == {f"7.{other}"}
        t.join(5)
        assert slow["r"].status_code == 200 and slow["r"].json()["replica"] == busy
        assert slow["r"].headers["x-gpufleet-replica"] == f"7.{busy}"


def test_failed_feed_keeps_the_last_list(bg: Background, replicas: Replicas) -> None:
    with gateway(bg, feed(replicas, "a")) as gw:
        assert gw.client.get("/healthz").status_code == 200
        assert gw.client.get("/readyz").json() == {"ready": True, "feed_at": 1.0, "services": 1}
        gw.source.fail("server restarting")
        deadline = time.monotonic() + 5
        while gw.metric("gpufleet_gateway_feed_failures_total") < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert gw.client.get("/s/llm/echo/", headers=AUTH).status_code == 200
        assert gw.metric('gpufleet_gateway_endpoints{service="llm"}') == 1.0


def test_a_client_that_stops_reading_is_cut(bg: Background, replicas: Replicas) -> None:
    """Issue 29: a caller that asks for a stream and never reads it must not hold the
    gateway's connection and the replica's stream for ever (``client_write_timeout_s``)."""
    config = GatewayConfig(refresh_s=0.02, client_write_timeout_s=0.5)
    with gateway(bg, feed(replicas, "a"), config) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        head = f"GET /s/llm/endless HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
        sock.sendall(head.encode())  # and never read
        try:
            deadline = time.monotonic() + 10
            while not any(path == "endless-stopped" for _, path, _ in replicas.seen):
                assert time.monotonic() < deadline, (
                    "the replica's stream outlived a client that left it unread"
                )
                time.sleep(0.05)
            assert gw.metric('gpufleet_gateway_requests_total{code="200",service="llm"}') == 1.0
        finally:
            sock.close()


class ClosingReplica:
    """A replica that answers the first request of each connection (keep-alive) and
    closes the connection, unanswered, when a second arrives on it: what a replica whose
    keep-alive timeout fires as the request goes out looks like to the gateway (the race
    of issue 30, finding 6, made deterministic)."""

    def __init__(self) -> None:
        self.requests = 0
        self.closed_unanswered = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                self.requests += 1
                if answered:
                    self.closed_unanswered += 1
                    return
                body = b'{"ok":true}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
                answered += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.mark.parametrize("method", ["POST", "GET"])
@pytest.mark.parametrize("replicas_n", [1, 2], ids=["one-replica", "two-replicas"])
def test_a_request_on_a_connection_the_replica_closed_is_resent_not_failed(
    bg: Background, replicas_n: int, method: str
) -> None:
    """Issue 30, finding 6: a kept-alive connection the replica closes as the request
    goes out is no failure: the request (POST too: no byte came back, the body is held)
    is sent again on a fresh connection, and the replica is not ejected."""
    upstreams = [ClosingReplica() for _ in range(replicas_n)]
    servers = []
    urls = {}
    for i, up in enumerate(upstreams):
        server = bg.run(asyncio.start_server(up.serve, "127.0.0.1", 0))
        servers.append(server)
        urls[f"c{i}"] = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        reps = Replicas(urls=urls)
        with gateway(bg, feed(reps, *urls)) as gw:
            codes = [
                gw.client.request(method, "/s/llm/infer", headers=AUTH, content=b"x" * 10).status_code
                for _ in range(10)
            ]
            assert codes == [200] * 10
            assert sum(u.closed_unanswered for u in upstreams) >= 3  # the race did happen, often
            assert gw.metric('gpufleet_gateway_ejections_total{service="llm"}') == 0
    finally:
        for server in servers:  # on its own loop: asyncio servers are not thread-safe
            bg.loop.call_soon_threadsafe(server.close)


class _CountedSource(StaticSource):
    def __init__(self, feed: Feed) -> None:
        super().__init__(feed)
        self.loads = 0

    async def load(self) -> Feed | None:
        self.loads += 1
        return await super().load()


def test_a_token_made_a_moment_ago_is_taken_at_once(bg: Background, replicas: Replicas) -> None:
    """``gpufleet service token NAME`` then a request at once: the gateway reads its feed
    again for a token no service lists (its next refresh may be far: 60 s here), instead
    of a 401; strangers trying tokens make it read at most every 0.25 s, and their 401
    says the token is not the service's (not that none was sent)."""
    first = feed(replicas, "a")
    source = _CountedSource(first)
    with gateway(bg, first, GatewayConfig(refresh_s=60.0), source) as gw:
        new = "gf_svc_made_a_moment_ago_0123456789"
        svc = first.services["llm"]
        tokens = svc.tokens | {hashlib.sha256(new.encode()).hexdigest()}
        source.set(replace(first, at=2.0, services={"llm": replace(svc, tokens=tokens)}))
        r = gw.client.get("/s/llm/echo/", headers={"Authorization": f"Bearer {new}"})
        assert r.status_code == 200, r.text
        loads = source.loads
        t0 = time.monotonic()
        strangers = [{"Authorization": f"Bearer gf_stranger_{i}"} for i in range(40)]
        answers = [gw.client.get("/s/llm/echo/", headers=h) for h in strangers]
        took = time.monotonic() - t0
        assert {a.status_code for a in answers} == {401}
        assert "not a service token of llm" in answers[0].json()["detail"]
        assert source.loads - loads <= took / 0.25 + 2, (source.loads - loads, took)
        none = gw.client.get("/s/llm/echo/")
        assert none.status_code == 401 and "a service token is required" in none.json()["detail"]
