"""The audit log: a row per mutating request with the right actor, object and status,
written before the reply (submissions: just after), node syncs left out, append-only;
``GET /v1/audit`` for admins, filtered and paged; ``gpufleet admin audit``; retention.
Against a real server on SQLite and PostgreSQL (retention: in process, both backends)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.exc import DBAPIError

from gpufleet.server.services import diagnoses
from gpufleet.server.services.audit import purge
from gpufleet.server.store import db as dbmod
from gpufleet.server.store.models import AuditRow, Job, JobDiagnosis, Team, User
from server.conftest import Server, gpufleet, make_pool, make_team, make_user, ok, scratch_postgres, unique
from server.playnode import register, sync

HOUR = 3600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Who:
    name: str
    token: str


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


def user(server: Server, team: str) -> Who:
    name = unique("aud")
    return Who(name=name, token=make_user(server, team=team, name=name))


def rows(server: Server, who: str) -> list[dict[str, Any]]:
    """Straight from the table, oldest first."""
    with server.engine.connect() as c:
        found = c.execute(text("SELECT * FROM audit WHERE actor = :a ORDER BY id"), {"a": who})
        return [dict(r._mapping) for r in found]


def eventually(read: Callable[[], list[dict[str, Any]]], n: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while len(got := read()) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return got


def test_submit_cancel_and_refusals_are_logged_with_actor_and_status(server: Server, team: str) -> None:
    alice = user(server, team)
    spec = {"command": ["true"], "team": team, "pool": make_pool(server)}
    with server.client(alice.token) as c:
        job = ok(c.post("/jobs", json=spec), 201)  # the route (the token is not cached yet)
        ok(c.post(f"/jobs/{job['id']}/cancel"))
        cancelled = f"/v1/jobs/{job['id']}/cancel"
        assert cancelled in [r["path"] for r in rows(server, alice.name)]  # committed before the reply
        fast = ok(c.post("/jobs", json=spec), 201)  # the token is cached now
        assert c.post("/jobs", json={"command": []}).status_code == 422
        assert c.post("/teams", json={"name": unique("t")}).status_code == 403
    got = eventually(lambda: rows(server, alice.name), 5)
    want = [
        ("POST", "/v1/jobs", str(job["id"]), 201),
        ("POST", f"/v1/jobs/{job['id']}/cancel", str(job["id"]), 200),
        ("POST", "/v1/jobs", str(fast["id"]), 201),
        ("POST", "/v1/jobs", None, 422),
        ("POST", "/v1/teams", None, 403),
    ]
    assert sorted(((r["method"], r["path"], r["object"], r["status"]) for r in got), key=repr) == sorted(
        want, key=repr
    )
    assert {(r["role"], r["address"]) for r in got} == {("user", "127.0.0.1")}
    assert all(r["token_id"] is not None for r in got)


@pytest.mark.parametrize(
    ("headers", "status"),
    [({}, 401), ({"Authorization": "Bearer gf_not_a_token"}, 401)],
    ids=["no-token", "unknown-token"],
)
def test_unauthenticated_requests_have_no_actor(server: Server, headers: dict[str, str], status: int) -> None:
    path = f"/v1/teams/{unique('nobody')}/members"
    with server.client(None) as c:
        assert c.post(server.url + path, json={"user": "x"}, headers=headers).status_code == status

    def found() -> list[dict[str, Any]]:
        with server.engine.connect() as c:
            return [
                dict(r._mapping) for r in c.execute(text("SELECT * FROM audit WHERE path = :p"), {"p": path})
            ]

    assert [(r["actor"], r["role"], r["status"]) for r in eventually(found, 1)] == [(None, None, status)]


def test_node_syncs_are_not_audited_but_registration_is(server: Server) -> None:
    node, token = register(server, pool=make_pool(server))
    sync(server, node, {"jobs": []}, token=token)
    with server.engine.connect() as c:
        paths = list(
            c.execute(text("SELECT path FROM audit WHERE path LIKE :p"), {"p": f"/v1/nodes/{node}%"})
        )
    assert sorted(p for (p,) in paths) == [f"/v1/nodes/{node}"]


def test_rows_are_append_only(server: Server) -> None:
    with server.client() as c:
        ok(c.post("/sessions"), 201)  # at least one row (written before the reply)
    with pytest.raises(DBAPIError, match="append-only"), server.engine.begin() as c:
        c.execute(text("UPDATE audit SET status = 200"))


@pytest.mark.parametrize(
    ("role", "status"), [("user", 403), ("operator", 403), ("admin", 200)], ids=["user", "operator", "admin"]
)
def test_only_admins_read_it(server: Server, team: str, role: str, status: int) -> None:
    with server.client(make_user(server, role=role, team=team)) as c:
        assert c.get("/audit").status_code == status


def test_pages_filters_and_cli(server: Server, team: str) -> None:
    bob = user(server, team)
    with server.client(bob.token) as c:
        for _ in range(5):
            ok(c.post("/sessions"), 201)
    want = [r["id"] for r in reversed(eventually(lambda: rows(server, bob.name), 5))]
    seen: list[int] = []
    cursor = None
    with server.client() as c:
        while True:
            params = {"user": bob.name, "limit": 2} | ({"cursor": cursor} if cursor else {})
            page = ok(c.get("/audit", params=params))
            assert len(page["items"]) <= 2
            seen += [r["id"] for r in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == want  # newest first, each once
        assert ok(c.get("/audit", params={"user": bob.name, "since": time.time() + HOUR}))["items"] == []
        assert c.get("/audit", params={"cursor": "x"}).status_code == 422
    out = gpufleet("admin", "audit", "--user", bob.name, "--since", "1h", "--json", env=server.env())
    assert out.returncode == 0, out.stderr
    assert [r["id"] for r in json.loads(out.stdout)] == want
    table = gpufleet("admin", "audit", "--user", bob.name, "--limit", "1", env=server.env())
    assert table.returncode == 0 and "POST /v1/sessions" in table.stdout
    assert len(table.stdout.strip().splitlines()) == 2  # header and one row


# -- retention (in process) ---------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def scratch(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[dbmod.Database]:
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'r.db'}"
        else:
            url = stack.enter_context(scratch_postgres("retention"))
        dbmod.upgrade(url)
        db = dbmod.Database.connect(url)
        stack.callback(db.dispose)
        yield db


def _put(db: dbmod.Database, ages_h: list[float], now: float) -> None:
    base = {"actor": "a", "role": "user", "token_id": 1, "address": "x", "method": "POST", "path": "/v1/x"}
    with db.write() as s:
        s.execute(
            insert(AuditRow), [base | {"at": now - h * HOUR, "object": None, "status": 200} for h in ages_h]
        )


@pytest.mark.parametrize("chunk", [1, 2, 1000], ids=["chunk-1", "chunk-2", "chunk-1000"])
def test_purge_deletes_only_older_rows(scratch: dbmod.Database, chunk: int) -> None:
    now = 1_000_000.0
    _put(scratch, [30, 25, 24.5, 23, 1, 0], now)
    assert purge(scratch, before=now - 24 * HOUR, chunk=chunk) == 3
    with scratch.read() as s:
        left = sorted(round((now - at) / HOUR, 1) for at in s.scalars(select(AuditRow.at)))
    assert left == [0.0, 1.0, 23.0]


def test_diagnoses_done_before_the_cutoff_go_and_queued_ones_stay(scratch: dbmod.Database) -> None:
    """The retention loop's ``diagnoses.purge``: done rows older than the cutoff go, in
    chunks; a queued row (no ``done_at``) stays however old, and so does the job."""
    now = 1_000_000.0
    with scratch.write() as s:
        s.add(Team(id=1, name="t"))
        s.add(User(id=1, name="u", role="user", created_at=0))
        s.flush()
        job = Job(
            name="j", user_id=1, team_id=1, pool="default", gpus=1, command=["x"], env={},
            state="FAILED", submit_time=now, pending_since=now,
        )  # fmt: skip
        s.add(job)
        s.flush()
        for attempt, done_h in enumerate([50, 49, 1, None]):
            s.add(
                JobDiagnosis(
                    job_id=job.id,
                    attempt=attempt,
                    node="n",
                    user_id=1,
                    queued_at=now - 60 * HOUR,
                    done_at=None if done_h is None else now - done_h * HOUR,
                )
            )
    assert diagnoses.purge(scratch, before=now - 48 * HOUR, chunk=1) == 2
    with scratch.read() as s:
        left = sorted(
            (a, d is None) for a, d in s.execute(select(JobDiagnosis.attempt, JobDiagnosis.done_at))
        )
        assert left == [(2, False), (3, True)]
        assert s.get(Job, job.id) is not None
