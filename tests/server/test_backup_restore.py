"""Backups of a running server, restored and served again (SQLite and PostgreSQL).

A server with jobs (ended, pending), a reservation and usage rows is backed up with
``gpufleet db backup`` while it runs; the backup is restored into an empty database and
a second server on it finds every job, reservation and usage row (counts, and the rows
themselves, column by column). A restore into that database again is refused and
changes nothing. A backup taken while jobs are being submitted restores to a database
whose every job has its events, and a server on it runs new jobs.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from gpufleet.server.store.tokenkey import default_secret_path
from server.conftest import (
    Server,
    drop_postgres,
    every,
    gpufleet,
    make_node,
    make_pool,
    make_team,
    make_user,
    ok,
    own_postgres,
    start_server,
    stop_server,
    wait_for,
)

TABLES = ("jobs", "job_events", "reservations", "usage", "users", "teams", "nodes", "gpus", "pools")
KEYS = {"jobs": "id", "reservations": "id", "usage": "id"}
PRICES = {"timezone": "UTC", "base": {"*": 3.0}}


@pytest.fixture(params=["sqlite", "postgresql"])
def urls(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The source database (empty) and the restore's target (empty, another database)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'src.db'}", f"sqlite:///{tmp_path / 'restored' / 'dst.db'}"
        return
    pg = os.environ.get("GPUFLEET_TEST_DATABASE_URL")
    if not pg:
        pytest.skip("GPUFLEET_TEST_DATABASE_URL not set: PostgreSQL tests skipped")
    name = make_url(pg).database  # databases of its own beside it: the session server keeps its own
    source, target = own_postgres(pg, f"{name}_bsrc"), own_postgres(pg, f"{name}_bdst")
    try:
        yield source, target
    finally:
        drop_postgres(source)
        drop_postgres(target)


@contextlib.contextmanager
def serving(url: str, *extra: str) -> Iterator[Server]:
    srv = start_server(url, extra=extra)
    try:
        yield srv
    finally:
        stop_server(srv)


def rows(url: str) -> dict[str, Any]:
    """Counts of ``TABLES`` and every row of jobs, reservations and usage, by key."""
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            out: dict[str, Any] = {
                t: c.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES
            }
            for table, key in KEYS.items():
                out[f"{table}_rows"] = {
                    r[key]: dict(r) for r in c.execute(text(f"SELECT * FROM {table}")).mappings()
                }
    finally:
        engine.dispose()
    return out


def populate(srv: Server) -> dict[str, Any]:
    """Ended jobs with cost (usage rows), a pending job, a booked reservation: what a
    quiet fleet holds (nothing left to change while it is backed up)."""
    pool, team, empty = make_pool(srv), make_team(srv), make_pool(srv)
    make_node(srv, pool=pool, gpus=4)
    token = make_user(srv, team=team)
    with srv.client() as admin:
        ok(admin.put("/prices", json=PRICES))
    ids = []
    with srv.client(token) as user:
        for gpus in (1, 2, 4):
            job = ok(
                user.post("/jobs", json={"command": ["x"], "gpus": gpus, "pool": pool, "team": team}), 201
            )
            wait_for(srv, job["id"], "SCHEDULED", token=token)
            time.sleep(0.2)
            ok(user.post(f"/jobs/{job['id']}/cancel"))
            ids.append(job["id"])
        waiting = ok(user.post("/jobs", json={"command": ["y"], "gpus": 1, "pool": empty, "team": team}), 201)
        ids.append(waiting["id"])
        booked = ok(
            user.post(
                "/reservations",
                json={"start": time.time() + 86400, "duration_s": 3600, "gpus": 2, "pool": pool},
            ),
            201,
        )
    return {"jobs": ids, "reservation": booked[0]["id"], "token": token, "pool": pool, "team": team}


def seen(srv: Server, made: dict[str, Any]) -> dict[str, Any]:
    """What the API shows of them: each job, the reservations, the month's usage."""
    with srv.client() as admin:
        jobs = {i: ok(admin.get(f"/jobs/{i}")) for i in made["jobs"]}
        reservations = {r["id"]: r for r in every(admin, "/reservations")}
        usage = ok(admin.get("/usage", params={"by": "team"}))
    keep = ("id", "state", "gpus", "pool", "team", "user", "cost", "submit_time", "command")
    return {
        "jobs": {i: {k: j.get(k) for k in keep} for i, j in jobs.items()},
        "reservation": reservations[made["reservation"]],
        "usage": usage["total"],
    }


def test_a_running_server_backed_up_and_restored_serves_every_row(
    urls: tuple[str, str], tmp_path: Path
) -> None:
    source, target = urls
    secret = str(default_secret_path(source))
    backup = tmp_path / "fleet.backup"
    with serving(source) as srv:
        made = populate(srv)
        time.sleep(1.0)  # the last pass and the accrual have settled
        before = rows(source)
        res = gpufleet("db", "backup", str(backup), "--database-url", source, timeout=120)
        assert res.returncode == 0, res.stderr
        assert rows(source) == before  # quiet: what the backup holds is `before`
        shown = seen(srv, made)
    assert before["usage"] > 0 and before["reservations"] >= 1 and before["jobs"] == 4
    res = gpufleet("db", "restore", str(backup), "--database-url", target, timeout=120)
    assert res.returncode == 0, res.stderr
    assert rows(target) == before  # every job, reservation and usage row, column by column
    with serving(target, "--token-secret-file", secret) as again:
        assert seen(again, made) == shown
        with again.client(made["token"]) as user:  # the user's token works: same secret
            assert [ok(user.get(f"/jobs/{i}"))["id"] for i in made["jobs"]] == made["jobs"]
    refused = gpufleet("db", "restore", str(backup), "--database-url", target, timeout=120)
    assert refused.returncode == 2 and "is not empty" in refused.stderr
    assert rows(target)["jobs"] == before["jobs"]


class Submitter(threading.Thread):
    """Submits jobs back to back until stopped; counts the ones accepted."""

    def __init__(self, srv: Server, token: str, pool: str, team: str) -> None:
        super().__init__(daemon=True)
        self.client = srv.client(token)
        self.body = {"command": ["z"], "gpus": 1, "pool": pool, "team": team}
        self.accepted = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        with self.client:
            while not self.stopping.is_set():
                try:
                    r = self.client.post("/jobs", json=self.body)
                except httpx.HTTPError:
                    continue
                if r.status_code == 201:
                    self.accepted += 1
                elif r.status_code == 429:
                    time.sleep(float(r.headers.get("Retry-After", "0.1")))


def test_a_backup_taken_while_jobs_are_submitted_is_consistent(urls: tuple[str, str], tmp_path: Path) -> None:
    source, target = urls
    secret = str(default_secret_path(source))
    backup = tmp_path / "busy.backup"
    with serving(source, "--rate-user", "off") as srv:
        pool, team = make_pool(srv), make_team(srv)
        make_node(srv, pool=pool, gpus=8)
        token = make_user(srv, team=team)
        load = Submitter(srv, token, pool, team)
        load.start()
        try:
            while load.accepted < 20:
                time.sleep(0.05)
            res = gpufleet("db", "backup", str(backup), "--database-url", source, timeout=120)
            assert res.returncode == 0, res.stderr
            during = load.accepted
            time.sleep(0.3)
        finally:
            load.stopping.set()
            load.join(30)
        assert load.accepted > during  # submissions went on while it was taken
    res = gpufleet("db", "restore", str(backup), "--database-url", target, timeout=120)
    assert res.returncode == 0, res.stderr
    engine = create_engine(target)
    try:
        with engine.connect() as c:
            jobs = c.execute(text("SELECT count(*) FROM jobs")).scalar_one()
            orphans = c.execute(
                text(
                    "SELECT count(*) FROM jobs j "
                    "WHERE NOT EXISTS (SELECT 1 FROM job_events e WHERE e.job_id = j.id)"
                )
            ).scalar_one()
            newest = c.execute(text("SELECT max(id) FROM jobs")).scalar_one()
    finally:
        engine.dispose()
    assert 20 <= jobs <= load.accepted and orphans == 0
    with serving(target, "--token-secret-file", secret) as again:
        with again.client(token) as user:
            job = ok(
                user.post("/jobs", json={"command": ["after"], "gpus": 1, "pool": pool, "team": team}), 201
            )
        assert job["id"] > newest
        with again.client() as admin:  # the restored queue is served: a restored job cancelled
            ok(admin.post(f"/jobs/{newest}/cancel"))
            assert ok(admin.get(f"/jobs/{newest}"))["state"] == "CANCELLED"
        assert ok(httpx.get(again.url + "/v1/readyz"))["status"] == "ready"
