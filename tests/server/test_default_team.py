"""A default team per user, as Slurm gives every user a DefaultAccount: a submission
that names no team is charged to it. The first admin's is ``default`` (created with
them), a user's is the first team they joined, and a user may change their own."""

from __future__ import annotations

from typing import Any

import pytest

from server.conftest import Server, gpufleet, make_pool, ok, unique

JOB: dict[str, Any] = {"command": ["true"], "gpus": 0}


def _submit(c: Any, pool: str, **kw: Any) -> Any:
    return c.post("/jobs", json={**JOB, "pool": pool, **kw})


def test_the_first_admin_can_submit_without_naming_a_team(server: Server) -> None:
    pool = make_pool(server, gpu=False)
    with server.client() as c:
        me = ok(c.get("/users/me"))
        assert me["default_team"] == "default" and "default" in me["teams"]
        assert ok(_submit(c, pool), 201)["team"] == "default"


def test_first_team_is_the_default_and_a_user_can_change_their_own(server: Server) -> None:
    pool = make_pool(server, gpu=False)
    a, b, other = unique("ta"), unique("tb"), unique("tc")
    with server.client() as admin:
        for t in (a, b, other):
            ok(admin.post("/teams", json={"name": t}), 201)
        name = unique("multi")
        made = ok(admin.post("/users", json={"name": name, "teams": [b, a]}), 201)
        assert made["default_team"] == b and made["teams"] == sorted([a, b])
        bystander = ok(admin.post("/users", json={"name": unique("by"), "teams": [other]}), 201)
    with server.client(made["token"]) as c:
        assert ok(_submit(c, pool), 201)["team"] == b
        assert ok(c.put(f"/users/{name}/default-team", json={"team": a}))["default_team"] == a
        assert ok(_submit(c, pool), 201)["team"] == a
        r = c.put(f"/users/{name}/default-team", json={"team": other})  # not theirs
        assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json")
        assert other in r.json()["detail"] and ok(c.get("/users/me"))["default_team"] == a
    with server.client(bystander["token"]) as c:  # another user's default: admins only
        assert c.put(f"/users/{name}/default-team", json={"team": a}).status_code == 403
    with server.client() as admin:
        assert ok(admin.put(f"/users/{name}/default-team", json={"team": b}))["default_team"] == b
        assert admin.put(f"/users/{unique('ghost')}/default-team", json={"team": b}).status_code == 404


def test_a_user_in_no_team_is_told_what_to_do(server: Server) -> None:
    pool = make_pool(server, gpu=False)
    with server.client() as admin:
        made = ok(admin.post("/users", json={"name": unique("lone")}), 201)
    assert made["default_team"] is None
    with server.client(made["token"]) as c:
        r = _submit(c, pool)
        assert r.status_code == 422 and "no team" in r.json()["detail"]


def test_cli_shows_and_sets_the_default_team(server: Server) -> None:
    if "postgresql" in server.db_url:
        pytest.skip("the CLI is a client of the API: its tests run once, on SQLite")
    a, b = unique("ca"), unique("cb")
    with server.client() as admin:
        for t in (a, b):
            ok(admin.post("/teams", json={"name": t}), 201)
        made = ok(admin.post("/users", json={"name": unique("cli"), "teams": [a, b]}), 201)
    env = server.env(made["token"])
    shown = gpufleet("default-team", env=env)
    assert shown.returncode == 0 and f"default team {a}" in shown.stdout, shown.stderr
    assert f"default team {b}" in gpufleet("default-team", b, env=env).stdout
    bad = gpufleet("default-team", unique("nope"), env=env)
    assert bad.returncode == 2 and "not a member" in bad.stderr
