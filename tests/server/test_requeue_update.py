"""``POST /v1/jobs/{id}/requeue`` (scontrol requeue) and ``PATCH /v1/jobs/{id}``
(scontrol update) through the API: who may, which states (409 with why), what changes
and the one event that records it. Nodes without agents: a placed job stays SCHEDULED."""

from __future__ import annotations

from typing import Any

import pytest

from server.conftest import ADMIN_TOKEN, Server, make_node, make_pool, make_team, make_user, ok, wait_for


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


def submit(srv: Server, token: str = ADMIN_TOKEN, **spec: Any) -> Any:
    with srv.client(token) as c:
        return ok(c.post("/jobs", json={"command": ["true"], "gpus": 1, **spec}), 201)


def call(srv: Server, method: str, path: str, token: str = ADMIN_TOKEN, **kw: Any) -> Any:
    with srv.client(token) as c:
        return c.request(method, path, **kw)


def test_requeue_puts_a_placed_job_back_and_refuses_the_rest(server: Server, team: str) -> None:
    pool = make_pool(server)
    make_node(server, pool=pool, gpus=1)
    placed = submit(server, pool=pool, team=team, time_limit="1h")
    wait_for(server, placed["id"], "SCHEDULED")
    waiting = submit(server, pool=make_pool(server), team=team)  # no node: it waits
    user = make_user(server, team=team)
    assert call(server, "POST", f"/jobs/{placed['id']}/requeue", user).status_code == 404  # not theirs
    back = ok(call(server, "POST", f"/jobs/{placed['id']}/requeue"))
    assert (back["state"], back["allocation"], back["attempts"]) == ("PENDING", [], 0)
    assert [(e["from_state"], e["to_state"]) for e in back["events"][-2:]] == [
        ("SCHEDULED", "REQUEUED"),
        ("REQUEUED", "PENDING"),
    ]
    assert back["events"][-1]["reason"] == "requeued by admin"
    resp = call(server, "POST", f"/jobs/{waiting['id']}/requeue")
    assert resp.status_code == 409 and "is PENDING: it is waiting already" in resp.json()["detail"]
    ok(call(server, "POST", f"/jobs/{waiting['id']}/cancel"))
    resp = call(server, "POST", f"/jobs/{waiting['id']}/requeue")
    assert resp.status_code == 409 and "has ended (CANCELLED)" in resp.json()["detail"]
    call(server, "POST", f"/jobs/{placed['id']}/cancel")


def test_a_no_requeue_job_is_not_requeued(server: Server, team: str) -> None:
    pool = make_pool(server)
    make_node(server, pool=pool, gpus=1)
    job = submit(server, pool=pool, team=team, requeue=False)
    wait_for(server, job["id"], "SCHEDULED")
    resp = call(server, "POST", f"/jobs/{job['id']}/requeue")
    assert resp.status_code == 409 and "--no-requeue" in resp.json()["detail"]
    call(server, "POST", f"/jobs/{job['id']}/cancel")


@pytest.mark.parametrize(
    ("who", "change", "status", "want"),
    [
        ("user", {"time_limit": "30m"}, 200, {"time_limit_s": 1800.0}),
        ("user", {"time_limit": 7200}, 200, {"time_limit_s": 7200.0}),
        ("user", {"time_limit": "3h"}, 403, "a time limit only goes down (2h00m now); operators raise it"),
        ("admin", {"time_limit": "3h"}, 200, {"time_limit_s": 10800.0}),
        ("user", {"name": "renamed"}, 200, {"name": "renamed"}),
        ("user", {"held": True}, 200, {"state": "HELD"}),
        ("user", {"held": False}, 200, {"state": "PENDING"}),
        ("user", {}, 422, "say what to change"),
        ("user", {"time_limit": "soon"}, 422, "time_limit: cannot read duration"),
        ("user", {"time_limit": 0}, 422, "between 1 second and 365 days"),
        ("other", {"name": "x"}, 404, "no job"),
    ],
    ids=[
        "down",
        "same",
        "up",
        "operator-up",
        "name",
        "hold",
        "release",
        "empty",
        "bad",
        "zero",
        "not-theirs",
    ],
)
def test_update(
    server: Server, team: str, who: str, change: dict[str, Any], status: int, want: dict[str, Any] | str
) -> None:
    token = make_user(server, team=team)
    job = submit(server, token, pool=make_pool(server), team=team, time_limit="2h")
    caller = {"user": token, "admin": ADMIN_TOKEN, "other": make_user(server, team=team)}[who]
    resp = call(server, "PATCH", f"/jobs/{job['id']}", caller, json=change)
    assert resp.status_code == status, resp.text
    if isinstance(want, str):
        assert want in resp.json()["detail"]
        return
    got = resp.json()
    assert {k: got[k] for k in want} == want
    assert got["events"][-1]["reason"].endswith(f"by {got['user'] if who == 'user' else 'admin'}")


def test_an_ended_job_is_not_updated(server: Server, team: str) -> None:
    job = submit(server, pool=make_pool(server), team=team)
    ok(call(server, "POST", f"/jobs/{job['id']}/cancel"))
    resp = call(server, "PATCH", f"/jobs/{job['id']}", json={"name": "late"})
    assert resp.status_code == 409 and "already finished (CANCELLED)" in resp.json()["detail"]
