"""The gateway under issue 29: its credential off the command line, ``/metrics`` behind a
token, and no request for an unknown service able to poison the traffic reports.

Black box: a real ``gpufleet server`` and real ``gpufleet gateway`` processes; a service
deployed with no replica answers 503 through the gateway, which is traffic the server
must still see. The ``/metrics`` rules of the app are a table run on the ASGI app
itself (no socket: the answer to one request)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.gateway import Endpoint, Feed, GatewayConfig, Service, StaticSource, create_app
from server.conftest import ADMIN_TOKEN, Server, free_port, make_pool, ok, start_server, stop_server, unique
from services.simnodes import start_gateway

SCRAPER = "gf_metrics_scraper_token_0123456789"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(f"sqlite:///{tmp_path_factory.mktemp('gwh') / 'g.db'}")
    yield s
    stop_server(s)


def _secret_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def _stop(proc: subprocess.Popen[bytes]) -> str:
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err.decode()


def _ready(url: str, proc: subprocess.Popen[bytes], services: int = 0) -> None:
    deadline = time.monotonic() + 20
    while True:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        try:
            got = httpx.get(url + "/readyz", timeout=1).json()
            if got["ready"] and got["services"] >= services:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the gateway never loaded its feed"
        time.sleep(0.1)


def _service(srv: Server) -> tuple[str, str]:
    """A service with no replica (its requests answer 503 at the gateway) and a token."""
    name = unique("gwh").lower().replace("_", "-").replace(".", "-")
    pool = make_pool(srv)
    spec = {"name": name, "command": ["model-server"], "pool": pool, "replicas": 0, "protocol": "http"}
    with srv.client() as c:
        ok(c.put(f"/services/{name}", json=spec))
        token = ok(c.post(f"/services/{name}/tokens"), 201)["token"]
    return name, str(token)


def _traffic(srv: Server, name: str, timeout: float = 15.0) -> dict[str, Any] | None:
    """The service's traffic once the server has some with requests in it (else None)."""
    deadline = time.monotonic() + timeout
    with srv.client() as c:
        while time.monotonic() < deadline:
            traffic = ok(c.get(f"/services/{name}"))["traffic"]
            if traffic is not None and traffic["qps"] > 0:
                return dict(traffic)
            time.sleep(0.2)
    return None


def test_the_gateway_takes_its_token_from_a_file_not_the_command_line(srv: Server, tmp_path: Path) -> None:
    token_file = _secret_file(tmp_path / "gw-token", ADMIN_TOKEN)
    port = free_port()
    proc = start_gateway(srv, port, "--token-file", str(token_file))
    url = f"http://127.0.0.1:{port}"
    try:
        _ready(url, proc)  # the feed was read with the file's token
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert ADMIN_TOKEN.encode() not in cmdline and str(token_file).encode() in cmdline
        assert httpx.get(url + "/metrics", timeout=5).status_code == 401
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        assert httpx.get(url + "/metrics", headers=auth, timeout=5).status_code == 200
    finally:
        err = _stop(proc)
    assert "warning" not in err, err


def test_the_token_from_the_environment_is_not_inherited(srv: Server, tmp_path: Path) -> None:
    """GPUFLEET_TOKEN works and leaves the gateway's environment once read."""
    port = free_port()
    proc = start_gateway(srv, port, env={"GPUFLEET_TOKEN": ADMIN_TOKEN})
    try:
        _ready(f"http://127.0.0.1:{port}", proc)
        assert ADMIN_TOKEN.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    finally:
        _stop(proc)


@pytest.mark.parametrize(
    ("mode", "content", "want"),
    [
        (0o644, ADMIN_TOKEN, "readable by others: chmod 600"),
        (0o640, ADMIN_TOKEN, "readable by others: chmod 600"),
        (0o600, "", "is empty"),
        (None, "", "cannot read"),
    ],
    ids=["world-readable", "group-readable", "empty", "missing"],
)
def test_an_unsafe_token_file_is_refused(tmp_path: Path, mode: int | None, content: str, want: str) -> None:
    path = tmp_path / "token"
    if mode is not None:
        _secret_file(path, content, mode)
    for option in ("--token-file", "--metrics-token-file"):
        args = (
            ["--token-file", str(path)] if option == "--token-file" else ["--metrics-token-file", str(path)]
        )
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpufleet",
                "gateway",
                "--endpoints-file",
                "/dev/null",
                "--port",
                "1",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={k: v for k, v in os.environ.items() if k != "GPUFLEET_TOKEN"},
        )
        assert done.returncode == 2 and want in done.stderr and option in done.stderr, done.stderr


def test_a_token_on_the_command_line_warns(srv: Server) -> None:
    port = free_port()
    proc = start_gateway(srv, port, "--token", ADMIN_TOKEN)
    try:
        _ready(f"http://127.0.0.1:{port}", proc)  # it still works
    finally:
        err = _stop(proc)
    assert "warning: --token puts the gateway's token on the command line" in err, err


def test_loadgen_takes_the_service_token_from_a_file(srv: Server, tmp_path: Path) -> None:
    name, svc_token = _service(srv)
    port = free_port()
    proc = start_gateway(srv, port, "--token-file", str(_secret_file(tmp_path / "t", ADMIN_TOKEN)))
    try:
        _ready(f"http://127.0.0.1:{port}", proc, services=1)
        out = tmp_path / "run.json"
        argv = [sys.executable, "-m", "gpufleet", "loadgen", f"http://127.0.0.1:{port}/s/{name}/x"]
        argv += ["--qps", "20", "--duration", "0.5s", "--json-out", str(out)]
        argv += ["--token-file", str(_secret_file(tmp_path / "svc", svc_token))]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert "warning" not in done.stderr, done.stderr
        errors = json.loads(out.read_text())["summary"]["errors"]
        assert set(errors) == {"503"}, errors  # past the token check: no ready replica
    finally:
        _stop(proc)
    loose = _secret_file(tmp_path / "loose", svc_token, 0o644)
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet", "loadgen", "http://127.0.0.1:1/", "--token-file", str(loose)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "readable by others" in done.stderr, done.stderr


def test_a_database_password_on_the_server_command_line_warns() -> None:
    url = "postgresql+psycopg://gpufleet:s3cret@127.0.0.1:1/gpufleet"
    argv = [sys.executable, "-m", "gpufleet", "server", "--port", str(free_port()), "--database-url", url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert "warning: --database-url holds a password" in done.stderr, done.stderr[-2000:]
    env = {**os.environ, "GPUFLEET_DATABASE_URL": url}
    quiet = subprocess.run(argv[:-2], capture_output=True, text=True, timeout=60, check=False, env=env)
    assert quiet.returncode != 0 and "holds a password" not in quiet.stderr, quiet.stderr[-2000:]


def test_an_unknown_service_does_not_poison_the_reports(srv: Server, tmp_path: Path) -> None:
    name, svc_token = _service(srv)
    port = free_port()
    proc = start_gateway(
        srv,
        port,
        "--token-file",
        str(_secret_file(tmp_path / "t", ADMIN_TOKEN)),
        "--metrics-token-file",
        str(_secret_file(tmp_path / "m", SCRAPER)),
    )
    gw = f"http://127.0.0.1:{port}"
    try:
        _ready(gw, proc, services=1)
        with httpx.Client(base_url=gw, headers={"Authorization": f"Bearer {svc_token}"}, timeout=5) as c:
            assert c.get(f"/s/{name}/x").status_code == 503  # the service's first report: a base
            assert httpx.get(gw + "/s/nosuch/x", timeout=5).status_code == 404
            time.sleep(0.6)  # reports go out with the unknown request counted
            codes = {c.get(f"/s/{name}/x").status_code for _ in range(20)}
        assert codes == {503}  # no replica: still the service's traffic
        traffic = _traffic(srv, name)
        assert traffic is not None and traffic["error_rate"] == 1.0, "the server lost the gateway's reports"
        scraped = httpx.get(gw + "/metrics", headers={"Authorization": f"Bearer {SCRAPER}"}, timeout=5)
        assert scraped.status_code == 200
        assert "gpufleet_gateway_unknown_service_requests_total 1.0" in scraped.text
        assert "gpufleet_gateway_report_failures_total 0.0" in scraped.text  # none refused
        assert 'service=""' not in scraped.text
        with srv.client() as c:
            metrics = httpx.get(srv.url + "/metrics", headers=c.headers, timeout=10).text
        assert f'gpufleet_service_requests_total{{code="503",service="{name}"' in metrics
    finally:
        _stop(proc)


def test_a_report_with_bad_entries_applies_the_good_ones(srv: Server) -> None:
    name, _ = _service(srv)
    good = {"codes": {"200": 5}, "inflight": 1}
    bad: dict[str, Any] = {
        "": {"codes": {"404": 3}},  # what an unknown service's requests made before
        "Not_A_Service": {"codes": {"200": 1}},
        "nosuch": {"codes": {"999": 1}},
        "garbage": "not counters",
    }
    with srv.client() as c:
        first = c.post("/gateway/report", json={"gateway": "gw-bad", "services": {name: {"codes": {}}} | bad})
        assert first.status_code == 204, first.text
        time.sleep(0.05)
        again = c.post("/gateway/report", json={"gateway": "gw-bad", "services": {name: good} | bad})
        assert again.status_code == 204, again.text
        traffic = ok(c.get(f"/services/{name}"))["traffic"]
        assert traffic is not None and traffic["qps"] > 0 and traffic["inflight"] == 1
        envelope = c.post("/gateway/report", json={"services": {name: good}})
        assert envelope.status_code == 422  # no gateway id: the report itself is malformed
        metrics = httpx.get(srv.url + "/metrics", headers=c.headers, timeout=10).text
    counted = {
        line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("gpufleet_gateway_report_rejected_items_total{")
    }
    assert counted['reason="name"'] >= 4 and counted['reason="counters"'] >= 4, counted


# -- /metrics of the app: a table -------------------------------------------------------------


async def _get(config: GatewayConfig, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
    app = create_app(StaticSource(Feed(at=1.0, services={})), config=config)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg: Any) -> None:
        sent.append(dict(msg))

    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "headers": headers}
    try:
        await app(scope, receive, send)
    finally:
        await app.stop()
    return int(sent[0]["status"]), b"".join(m.get("body", b"") for m in sent[1:])


BEARER = [(b"authorization", f"Bearer {SCRAPER}".encode())]
WRONG = [(b"authorization", b"Bearer nope")]
CLOSED = GatewayConfig()
TOKENED = GatewayConfig(metrics_tokens=frozenset({_digest(SCRAPER)}))
PUBLIC = GatewayConfig(metrics_public=True)


@pytest.mark.parametrize(
    ("config", "headers", "status", "says"),
    [
        (CLOSED, [], 401, b"--metrics-token-file or --metrics-public"),
        (CLOSED, BEARER, 401, b"--metrics-token-file or --metrics-public"),
        (TOKENED, [], 401, b"takes a token"),
        (TOKENED, WRONG, 401, b"takes a token"),
        (TOKENED, BEARER, 200, b"gpufleet_gateway_"),
        (PUBLIC, [], 200, b"gpufleet_gateway_"),
    ],
    ids=["closed", "closed-any-token", "no-token", "wrong-token", "token", "public"],
)
def test_metrics_take_a_token_unless_public(
    config: GatewayConfig, headers: list[tuple[bytes, bytes]], status: int, says: bytes
) -> None:
    got, body = asyncio.run(_get(config, "/metrics", headers))
    assert got == status and says in body, body[:300]


def test_health_needs_no_token() -> None:
    got, _ = asyncio.run(_get(CLOSED, "/healthz", []))
    assert got == 200


async def _through_a_stalled_replica(config: GatewayConfig) -> tuple[int, float]:
    """(status, seconds) of one request to a replica that accepts, reads and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.read(65_536)

    server = await asyncio.start_server(stall, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    endpoint = Endpoint(id="1.0", url=f"http://127.0.0.1:{port}", job_id=1)
    service = Service(name="llm", tokens=frozenset({_digest(SCRAPER)}), endpoints=(endpoint,))
    app = create_app(StaticSource(Feed(at=1.0, services={"llm": service})), config=config)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg: Any) -> None:
        sent.append(dict(msg))

    scope = {"type": "http", "method": "GET", "path": "/s/llm/x", "raw_path": b"/s/llm/x", "headers": BEARER}
    t0 = time.monotonic()
    try:
        await app(scope, receive, send)
    finally:
        await app.stop()
        for w in held:
            w.close()
        server.close()
    return int(sent[0]["status"]), time.monotonic() - t0


def test_a_stalled_replica_cannot_hold_a_request() -> None:
    """The upstream read timeout: a replica silent for ``read_timeout_s`` is a 504."""
    status, took = asyncio.run(_through_a_stalled_replica(GatewayConfig(read_timeout_s=0.5)))
    assert status == 504 and 0.4 < took < 5
    assert GatewayConfig().connect_timeout_s <= 5 and GatewayConfig().read_timeout_s <= 300
