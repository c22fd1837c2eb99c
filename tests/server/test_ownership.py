"""Who may act on someone else's job: role x endpoint -> status.

A plain user does not see other users' jobs at all: 404 (the id is not revealed).
Operators and admins act on every job; changing a priority is theirs only (403 for the
job's owner). Every case runs on a fresh job owned by ``owner`` in a pool without nodes,
so it stays PENDING (or HELD, for release).
"""

from __future__ import annotations

from typing import Any

import pytest

from server.conftest import Server, make_pool, make_team, make_user, ok

ACTIONS: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "show": ("GET", "/jobs/{id}", None),
    "cancel": ("POST", "/jobs/{id}/cancel", None),
    "hold": ("POST", "/jobs/{id}/hold", None),
    "release": ("POST", "/jobs/{id}/release", None),
    "priority": ("PUT", "/jobs/{id}/priority", {"priority": 5}),
}

MATRIX = [
    # actor,     action,     status
    ("admin", "show", 200),
    ("admin", "cancel", 200),
    ("admin", "hold", 200),
    ("admin", "release", 200),
    ("admin", "priority", 200),
    ("operator", "show", 200),
    ("operator", "cancel", 200),
    ("operator", "hold", 200),
    ("operator", "release", 200),
    ("operator", "priority", 200),
    ("owner", "show", 200),
    ("owner", "cancel", 200),
    ("owner", "hold", 200),
    ("owner", "release", 200),
    ("owner", "priority", 403),
    ("other", "show", 404),
    ("other", "cancel", 404),
    ("other", "hold", 404),
    ("other", "release", 404),
    ("other", "priority", 404),
]


@pytest.fixture(scope="module")
def people(server: Server) -> dict[str, str]:
    team = make_team(server)
    return {
        "team": team,
        "pool": make_pool(server),
        "admin": "gf_test_admin_token",
        "operator": make_user(server, role="operator", team=team),
        "owner": make_user(server, team=team),
        "other": make_user(server, team=team),
    }


@pytest.mark.parametrize(("actor", "action", "status"), MATRIX, ids=[f"{a}-{b}" for a, b, _ in MATRIX])
def test_job_actions_by_role(
    server: Server, people: dict[str, str], actor: str, action: str, status: int
) -> None:
    with server.client(people["owner"]) as owner:
        job = ok(owner.post("/jobs", json={"command": ["true"], "pool": people["pool"]}), 201)
    if action == "release":
        with server.client() as admin:
            ok(admin.post(f"/jobs/{job['id']}/hold"))
    method, path, body = ACTIONS[action]
    before = server.counts()
    with server.client(people[actor]) as c:
        resp = c.request(method, path.format(id=job["id"]), json=body)
    assert resp.status_code == status, resp.text
    if status >= 400:
        assert resp.headers["content-type"] == "application/problem+json"
        assert server.counts() == before
    elif action != "show":
        assert server.counts()["job_events"] == before["job_events"] + 1


def test_lists_show_only_own_jobs_to_users(server: Server, people: dict[str, str]) -> None:
    with server.client(people["owner"]) as owner:
        mine = ok(owner.post("/jobs", json={"command": ["true"], "pool": people["pool"]}), 201)
    with server.client(people["other"]) as other:
        ids = {j["id"] for j in ok(other.get("/jobs", params={"limit": 1000}))["items"]}
        assert mine["id"] not in ids
    with server.client(people["operator"]) as op:
        page = ok(op.get("/jobs", params={"user": mine["user"], "limit": 1000}))
        assert mine["id"] in {j["id"] for j in page["items"]}


def test_user_submits_only_for_own_team(server: Server, people: dict[str, str]) -> None:
    foreign = make_team(server)
    with server.client(people["owner"]) as c:
        resp = c.post("/jobs", json={"command": ["true"], "pool": people["pool"], "team": foreign})
    assert resp.status_code == 403


ADMIN_ONLY = [
    ("POST", "/teams", {"name": "t-forbidden"}),
    ("POST", "/users", {"name": "u-forbidden"}),
    ("POST", "/pools", {"name": "p-forbidden"}),
    ("PUT", "/teams/{team}/quota", {"gpus": 4}),
]


@pytest.mark.parametrize("actor", ["operator", "owner"])
@pytest.mark.parametrize(("method", "path", "body"), ADMIN_ONLY, ids=[f"{m} {p}" for m, p, _ in ADMIN_ONLY])
def test_admin_only_endpoints(
    server: Server, people: dict[str, str], actor: str, method: str, path: str, body: dict[str, Any]
) -> None:
    before = server.counts()
    with server.client(people[actor]) as c:
        resp = c.request(method, path.format(team=people["team"]), json=body)
    assert resp.status_code == 403
    assert server.counts() == before


def test_users_cannot_register_or_sync_nodes(server: Server, people: dict[str, str]) -> None:
    with server.client(people["owner"]) as c:
        assert c.put("/nodes/n-x", json={"gpus": []}).status_code == 403
        assert c.post("/nodes/n-x/sync", json={"jobs": []}).status_code == 403
