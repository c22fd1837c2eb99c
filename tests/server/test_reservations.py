"""Reservations end to end on the real server (SQLite and PostgreSQL): admission,
conflicts as 409 problem+json, ownership, and the scheduler keeping non-owners off
reserved GPUs inside the window."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from server.conftest import (
    Server,
    every,
    gpufleet,
    make_node,
    make_pool,
    make_team,
    make_user,
    ok,
    wait_for,
)

HOUR = 3600.0


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


def reserve(server: Server, token: str | None = None, status: int = 201, **spec: Any) -> Any:
    body = {"duration_s": HOUR, **spec}
    with server.client(token) if token else server.client() as c:
        resp = c.post("/reservations", json=body)
    if status != 201:
        assert resp.status_code == status, resp.text
        assert resp.headers["content-type"].startswith("application/problem+json")
        return resp.json()
    return ok(resp, 201)


def _ids(rows: list[dict[str, Any]]) -> list[int]:
    return [r["id"] for r in rows]


@pytest.mark.parametrize(
    ("first", "second", "ok_second"),
    [
        ({"gpus": 16, "start": 0}, {"gpus": 16, "start": HOUR}, True),
        ({"gpus": 16, "start": 0}, {"gpus": 16, "start": HOUR / 2}, False),
        ({"gpus": 4, "start": 0}, {"gpus": 12, "start": 0}, True),
        ({"gpus": 6, "start": 0}, {"gpus": 8, "start": 0, "gpus_per_node": 8, "nodes": 1}, True),
        ({"gpus": 12, "start": 0}, {"gpus": 8, "start": 0, "gpus_per_node": 8, "nodes": 1}, False),
        ({"gpus": 12, "start": 0}, {"gpus": 8, "start": -2 * HOUR / 3, "repeat": "daily", "count": 3}, False),
        ({"gpus": 8, "start": 0}, {"gpus": 8, "start": 2 * HOUR, "repeat": "daily", "count": 3}, True),
    ],
    ids=[
        "back-to-back",
        "overlap-full",
        "partial-nodes-fit",
        "partial-node-whole-node-left",
        "partial-nodes-no-whole-node",
        "repeat-conflict-first-window",
        "repeat-fits",
    ],
)
def test_admission(server: Server, first: dict[str, Any], second: dict[str, Any], ok_second: bool) -> None:
    pool = make_pool(server)
    make_node(server, pool=pool, gpus=8)
    make_node(server, pool=pool, gpus=8)
    t0 = time.time() + 10 * 86400
    a = reserve(server, pool=pool, **{**first, "start": t0 + first["start"]})
    assert a[0]["state"] == "BOOKED" and a[0]["gpus"] == first["gpus"]
    spec = {**second, "start": t0 + second["start"]}
    with server.client() as c:
        before = len(every(c, "/reservations"))
    if ok_second:
        got = reserve(server, pool=pool, **spec)
        assert len(got) == spec.get("count", 1) if spec.get("repeat") else len(got) == 1
    else:
        problem = reserve(server, status=409, pool=pool, **spec)
        assert f"overlapping reservations: {a[0]['id']}" in problem["detail"]
        with server.client() as c:
            assert len(every(c, "/reservations")) == before  # all or nothing


def test_maintenance_on_named_nodes_is_for_operators(server: Server, team: str) -> None:
    pool = make_pool(server)
    n1 = make_node(server, pool=pool, gpus=4)
    user = make_user(server, team=team)
    t0 = time.time() + 20 * 86400
    spec: dict[str, Any] = {"start": t0, "node_names": [n1], "maintenance": True, "pool": pool}
    assert reserve(server, user, status=403, **spec)["status"] == 403
    m = reserve(server, **spec)[0]
    assert (m["nodes"], m["maintenance"], m["gpus"]) == ([[n1, 4]], True, 4)
    clash = reserve(server, status=409, pool=pool, gpus=1, start=t0 + 60)
    assert str(m["id"]) in clash["detail"]
    assert str(m["id"]) in reserve(server, status=409, **spec)["detail"]


def test_ownership_list_and_cancel(server: Server, team: str) -> None:
    pool = make_pool(server)
    make_node(server, pool=pool, gpus=4)
    alice, bob = make_user(server, team=team), make_user(server, team=team)
    t0 = time.time() + 30 * 86400
    mine = reserve(server, alice, pool=pool, gpus=1, start=t0)[0]
    theirs = reserve(server, pool=pool, gpus=1, start=t0)[0]
    with server.client(alice) as c:
        assert mine["id"] in _ids(every(c, "/reservations"))
        assert theirs["id"] not in _ids(every(c, "/reservations"))
        assert c.delete(f"/reservations/{theirs['id']}").status_code == 404
    with server.client(bob) as c:
        assert c.delete(f"/reservations/{mine['id']}").status_code == 404
    with server.client(alice) as c:
        assert ok(c.delete(f"/reservations/{mine['id']}"))["state"] == "CANCELLED"
        assert c.delete(f"/reservations/{mine['id']}").status_code == 409
    with server.client() as c:  # the admin sees all, the reason included
        row = next(r for r in every(c, "/reservations") if r["id"] == mine["id"])
    assert row["reason"].startswith("cancelled by ")


def test_non_owner_job_stays_off_reserved_gpus(server: Server, team: str) -> None:
    pool = make_pool(server)
    node = make_node(server, pool=pool, gpus=4)
    owner = make_user(server, team=team)
    with server.client(owner) as c:
        owner_name = ok(c.get("/users/me"))["name"]
    r = reserve(server, owner, pool=pool, gpus=3, start=time.time() - 1, users=[owner_name])[0]
    with server.client() as c:
        outsider = ok(c.post("/jobs", json={"command": ["x"], "gpus": 2, "pool": pool, "team": team}), 201)
        small = ok(c.post("/jobs", json={"command": ["x"], "gpus": 1, "pool": pool, "team": team}), 201)
    with server.client(owner) as c:
        mine = ok(
            c.post("/jobs", json={"command": ["x"], "gpus": 3, "pool": pool, "reservation": r["id"]}), 201
        )
    # A reservation books GPU *counts* per node: the unreserved one is free for anyone.
    owned = wait_for(server, mine["id"], "SCHEDULED")["allocation"]
    other = wait_for(server, small["id"], "SCHEDULED")["allocation"]
    assert [a["node"] for a in owned + other] == [node, node]
    assert len(owned[0]["gpus"]) == 3 and len(other[0]["gpus"]) == 1
    assert not set(owned[0]["gpus"]) & set(other[0]["gpus"])
    time.sleep(0.3)
    with server.client() as c:
        waiting = ok(c.get(f"/jobs/{outsider['id']}"))
    assert waiting["state"] == "PENDING" and waiting["allocation"] == []
    with server.client() as c:
        bad = c.post(
            "/jobs", json={"command": ["x"], "gpus": 1, "pool": pool, "team": team, "reservation": 10**9}
        )
    assert bad.status_code == 422 and "reservation" in bad.json()["detail"]
    with server.client() as c:  # leave nothing waiting: queue positions are fleet-wide
        for job in (outsider, small, mine):
            c.post(f"/jobs/{job['id']}/cancel")


def test_cli_reserve_list_cancel_submit(server: Server) -> None:
    pool = make_pool(server)
    make_node(server, pool=pool, gpus=4, model="H100")
    env = {**server.env(), "TZ": "Europe/Berlin"}
    made = gpufleet(
        "reserve", "--gpus", "2", "--gpu-type", "H100", "--start", "+1d", "--duration", "2h",
        "--pool", pool, "--name", "train", "--repeat", "daily", "--count", "2", "--json", env=env,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    rows = json.loads(made.stdout)
    assert [r["name"] for r in rows] == ["train#1", "train#2"]
    listed = gpufleet("reservations", env=env)
    assert listed.returncode == 0 and "train#1" in listed.stdout and ("CET" in listed.stdout)
    refused = gpufleet(
        "reserve", "--gpus", "4", "--start", "+1d", "--duration", "1h", "--pool", pool, env=env
    )
    assert refused.returncode == 1 and f"overlapping reservations: {rows[0]['id']}" in refused.stderr
    team = make_team(server)
    sub = gpufleet(
        "submit", "--pool", pool, "--team", team, "--reservation", str(rows[0]["id"]), "--", "true", env=env
    )
    assert sub.returncode == 0, sub.stderr
    gone = gpufleet("reservation", "cancel", str(rows[1]["id"]), env=env)
    assert gone.returncode == 0 and "cancelled" in gone.stdout
    assert gpufleet("cancel", sub.stdout.strip(), env=env).returncode == 0
