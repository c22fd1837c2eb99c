"""What a submit may claim: a priority above 0 (operators and admins only, like
``PUT /v1/jobs/{id}/priority``) and a reservation (its users and its team's members;
operators and admins may override), whether the caller's token is cached or not."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import httpx
import pytest

from server.conftest import ADMIN_TOKEN, Server, make_pool, make_team, make_user, ok
from server.playnode import register

PLAIN = {"content-type": "application/json"}  # the fast submit path takes these
SLOW = {"content-type": "application/json; charset=utf-8"}  # ... and leaves these to the route
PATHS = pytest.mark.parametrize("headers", [PLAIN, SLOW], ids=["fast-path", "route"])


@pytest.fixture(scope="module")
def world(server: Server) -> dict[str, str]:
    team, other_team = make_team(server), make_team(server)
    pool = make_pool(server)
    register(server, pool=pool, gpus=2)
    return {
        "team": team,
        "other_team": other_team,
        "pool": pool,
        "admin": ADMIN_TOKEN,
        "operator": make_user(server, role="operator", team=team),
        "user": make_user(server, team=team),
        "listed": make_user(server, team=other_team),
        "member": make_user(server, team=team),
        "outsider": make_user(server, team=other_team),
    }


def post(server: Server, token: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
    with server.client(token) as c:
        ok(c.get("/users/me"))  # the token is cached (the submit then skips the token look-up)
        return c.post("/jobs", content=json.dumps(body).encode(), headers=headers)


PRIORITY = [
    ("user", 1000, 403),
    ("user", 1, 403),
    ("user", 0, 201),
    ("user", -5, 201),
    ("operator", 1000, 201),
    ("admin", 1000, 201),
]


@PATHS
@pytest.mark.parametrize(("who", "priority", "status"), PRIORITY, ids=[f"{w}-{p}" for w, p, _ in PRIORITY])
def test_priority_above_zero_at_submit_is_for_operators(
    server: Server, world: dict[str, str], who: str, priority: int, status: int, headers: dict[str, str]
) -> None:
    body = {"command": ["true"], "pool": world["pool"], "team": world["team"], "priority": priority}
    before = server.counts()
    resp = post(server, world[who], body, headers)
    assert resp.status_code == status, resp.text
    if status == 403:
        assert resp.headers["content-type"] == "application/problem+json"
        assert "priority" in resp.json()["detail"]
        assert server.counts() == before
    else:
        assert resp.json()["priority"] == priority
        with server.client() as c:
            ok(c.post(f"/jobs/{resp.json()['id']}/cancel"))


_windows = itertools.count(1)


def _reserve(server: Server, world: dict[str, str], **kw: Any) -> int:
    """A one-GPU window of its own (later windows than the previous ones: no conflicts)."""
    spec = {
        "start": time.time() + 7200 * next(_windows),
        "duration_s": 3600,
        "gpus": 1,
        "pool": world["pool"],
        **kw,
    }
    with server.client(world["operator"]) as c:
        return int(ok(c.post("/reservations", json=spec), 201)[0]["id"])


RESERVATION = [
    # who, booked for, status
    ("listed", "users", 201),
    ("outsider", "users", 403),
    ("member", "team", 201),
    ("outsider", "team", 403),
    ("user", "users", 403),
    ("operator", "users", 201),
    ("admin", "team", 201),
]


@PATHS
@pytest.mark.parametrize(
    ("who", "booked_for", "status"), RESERVATION, ids=[f"{w}-of-{b}" for w, b, _ in RESERVATION]
)
def test_only_a_reservations_people_submit_into_it(
    server: Server, world: dict[str, str], who: str, booked_for: str, status: int, headers: dict[str, str]
) -> None:
    with server.client(world["listed"]) as c:
        listed = ok(c.get("/users/me"))["name"]
    rid = (
        _reserve(server, world, users=[listed])
        if booked_for == "users"
        else _reserve(server, world, team=world["team"])
    )
    team = world["other_team"] if who in ("listed", "outsider") else world["team"]
    body = {"command": ["true"], "pool": world["pool"], "team": team, "reservation": rid}
    before = server.counts()
    resp = post(server, world[who], body, headers)
    assert resp.status_code == status, resp.text
    if status == 403:
        assert resp.headers["content-type"] == "application/problem+json"
        assert f"reservation {rid}" in resp.json()["detail"]
        assert server.counts() == before
    else:
        assert resp.json()["reservation"] == rid
        with server.client() as c:
            ok(c.post(f"/jobs/{resp.json()['id']}/cancel"))
