"""A real gpufleet server (uvicorn in a subprocess) per database backend.

``server`` is parametrised over SQLite (a temp file) and PostgreSQL (the URL in
GPUFLEET_TEST_DATABASE_URL; all tables are dropped first so runs are independent).
Tests talk to it over HTTP with httpx and count rows straight in its database.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import MetaData, create_engine, func, select, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import OperationalError

from gpufleet.client import tls_verify

ADMIN_TOKEN = "gf_test_admin_token"
_names = itertools.count(1)


def unique(prefix: str) -> str:
    return f"{prefix}{os.getpid()}x{next(_names)}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gpufleet(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30, python_flags: bool = False
) -> subprocess.CompletedProcess[str]:
    """``gpufleet ARGS`` (``python ARGS`` with ``python_flags``: ``-X importtime -m gpufleet ...``)."""
    return subprocess.run(
        [sys.executable, *(() if python_flags else ("-m", "gpufleet")), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@dataclass
class Server:
    url: str
    db_url: str
    engine: Engine
    proc: subprocess.Popen[bytes]
    ca_file: str | None = None
    """The cluster CA of a server started with TLS (``start_server(tls_dir=...)``)."""
    log: Path | None = None
    """The server's stderr (a file, never a pipe nobody reads: a server whose pipe filled
    up after ~64 KiB of warnings would block mid-request)."""

    def stderr(self) -> str:
        return "" if self.log is None else self.log.read_text(errors="replace")

    def client(self, token: str | None = ADMIN_TOKEN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(
            base_url=self.url + "/v1", headers=headers, timeout=30, verify=tls_verify(self.ca_file)
        )

    def counts(self) -> dict[str, int]:
        tables = ("jobs", "job_events", "allocations", "users", "teams", "tokens", "nodes", "gpus", "pools")
        with self.engine.connect() as c:
            return {t: c.execute(select(func.count()).select_from(text(t))).scalar_one() for t in tables}

    def env(self, token: str = ADMIN_TOKEN) -> dict[str, str]:
        return {"GPUFLEET_URL": self.url, "GPUFLEET_TOKEN": token, "GPUFLEET_CA_FILE": self.ca_file or ""}


def start_server(db_url: str, *, extra: tuple[str, ...] = (), tls_dir: Path | None = None) -> Server:
    """A ``gpufleet server`` process on ``db_url`` (empty, or at this gpufleet's schema);
    with ``tls_dir`` (made by ``gpufleet ca init``) on
    HTTPS with that directory's CA and server certificate (agents then use mTLS)."""
    # no `gpufleet db upgrade` first: the server creates the schema of an empty database
    # (and the tests' databases are new or emptied), which saves a process start a server
    port = free_port()
    ca_file = None
    if tls_dir is not None:
        ca_file = str(tls_dir / "ca.crt")
        tls = ("--tls-cert", str(tls_dir / "server.crt"), "--tls-key", str(tls_dir / "server.key"))
        extra = (*extra, *tls, "--ca-dir", str(tls_dir))
    fd, name = tempfile.mkstemp(prefix="gpufleet-server-", suffix=".log")
    log = Path(name)
    with os.fdopen(fd, "wb") as err_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpufleet",
                "server",
                "--port",
                str(port),
                "--database-url",
                db_url,
                *extra,
            ],
            env={**os.environ, "GPUFLEET_ADMIN_TOKEN": ADMIN_TOKEN},
            stdout=subprocess.DEVNULL,
            stderr=err_file,
        )
    url = f"{'https' if tls_dir else 'http'}://127.0.0.1:{port}"
    deadline = time.monotonic() + float(os.environ.get("GPUFLEET_TEST_SERVER_START_S", "60"))  # upper bound
    while True:
        try:
            if httpx.get(url + "/v1/healthz", timeout=1, verify=tls_verify(ca_file)).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait(10)
            err = log.read_text(errors="replace")
            log.unlink(missing_ok=True)
            raise RuntimeError(f"server did not start: {err}")
        time.sleep(0.05)
    return Server(url=url, db_url=db_url, engine=create_engine(db_url), proc=proc, ca_file=ca_file, log=log)


def stop_server(srv: Server) -> None:
    srv.proc.terminate()
    try:
        srv.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        srv.proc.kill()
    srv.engine.dispose()
    if srv.log is not None:
        srv.log.unlink(missing_ok=True)


def reset_postgres(url: str) -> None:
    """Every table of ``url``'s database dropped. Whatever is still connected to it (a
    stopped server's scheduler child that has not let go yet: under ``pytest -n 2`` a
    worker may set its session server up again) is disconnected first, so the drop never
    deadlocks with it; a deadlock anyway is tried again."""
    engine = create_engine(url)
    try:
        for attempt in range(3):
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
                c.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                )
            try:
                meta = MetaData()
                meta.reflect(engine)
                meta.drop_all(engine)
                return
            except OperationalError:
                if attempt == 2:
                    raise
                time.sleep(0.5)
    finally:
        engine.dispose()


def own_postgres(url: str, name: str) -> str:
    """A database ``name`` next to the one in ``url`` (created if missing), emptied. Tests
    that write to PostgreSQL in process use one: the session server's scheduler (a real
    clock) owns ``url``'s database and would start their jobs."""
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            if c.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first() is None:
                c.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    own = make_url(url).set(database=name).render_as_string(hide_password=False)
    reset_postgres(own)
    return own


def drop_postgres(url: str) -> None:
    name = make_url(url).database
    admin = create_engine(make_url(url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@contextlib.contextmanager
def scratch_postgres(label: str) -> Iterator[str]:
    """A PostgreSQL database of its own for an in-process test (skips without one),
    dropped afterwards."""
    pg = os.environ.get("GPUFLEET_TEST_DATABASE_URL")
    if not pg:
        pytest.skip("GPUFLEET_TEST_DATABASE_URL not set: PostgreSQL tests skipped")
    url = own_postgres(pg, f"gpufleet_{label}_{os.getpid()}")
    try:
        yield url
    finally:
        drop_postgres(url)


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    if request.param == "sqlite":
        db_url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'gpufleet.db'}"
    else:
        pg = os.environ.get("GPUFLEET_TEST_DATABASE_URL")
        if not pg:
            pytest.skip("GPUFLEET_TEST_DATABASE_URL not set: PostgreSQL tests skipped")
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        if worker:  # each test worker its own database next to the given one (pytest -n)
            db_url = own_postgres(pg, f"gpufleet_test_{worker}")
        else:
            reset_postgres(pg)
            db_url = pg
    srv = start_server(db_url)
    yield srv
    stop_server(srv)


# -- factories -------------------------------------------------------------------------------


def ok(resp: httpx.Response, status: int = 200) -> Any:
    assert resp.status_code == status, resp.text
    return resp.json()


def every(c: httpx.Client, path: str, **params: Any) -> list[Any]:
    """Every item of a paged list, following ``next_cursor``."""
    items: list[Any] = []
    cursor = None
    while True:
        page = ok(c.get(path, params={**params, "limit": 1000, **({"cursor": cursor} if cursor else {})}))
        items += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            return items


def make_team(srv: Server, name: str | None = None) -> str:
    name = name or unique("team")
    with srv.client() as c:
        ok(c.post("/teams", json={"name": name}), 201)
        ok(c.post(f"/teams/{name}/members", json={"user": "admin"}))
    return name


def make_user(srv: Server, *, role: str = "user", team: str, name: str | None = None) -> str:
    with srv.client() as c:
        made = ok(c.post("/users", json={"name": name or unique(role), "role": role, "teams": [team]}), 201)
    return str(made["token"])


def make_pool(srv: Server, *, gpu: bool = True) -> str:
    name = unique("pool")
    with srv.client() as c:
        ok(c.post("/pools", json={"name": name, "gpu": gpu}), 201)
    return name


def make_node(srv: Server, *, pool: str, gpus: int = 4, model: str = "H100", name: str | None = None) -> str:
    name = name or unique("node")
    spec = {
        "pool": pool,
        "gpus": [{"index": i, "model": model, "uuid": f"GPU-{name}-{i}"} for i in range(gpus)],
    }
    with srv.client() as c:
        ok(c.put(f"/nodes/{name}", json=spec))
    return name


def wait_for(srv: Server, job_id: int, state: str, *, token: str = ADMIN_TOKEN, timeout: float = 10) -> Any:
    deadline = time.monotonic() + timeout
    with srv.client(token) as c:
        while True:
            resp = c.get(f"/jobs/{job_id}")
            if resp.status_code == 429:  # a user's request bucket is empty: wait as told
                time.sleep(float(resp.headers["Retry-After"]))
                continue
            job = ok(resp)
            if job["state"] == state or time.monotonic() > deadline:
                assert job["state"] == state, job
                return job
            time.sleep(0.02)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]
