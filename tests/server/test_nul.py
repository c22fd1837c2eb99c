"""NUL characters (and other text that is not Unicode) from users and nodes.

PostgreSQL's text columns cannot hold U+0000. Log output from a node is cleaned (NUL
shown as U+2400 "␀") and stored; every other string in a request body is refused with a
422 problem naming the field, on both submit paths; a NUL in a URL path or query is a
400. Nothing is written by a refused request, and the node goes on syncing."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from server.conftest import Server, make_pool, make_team, ok, unique, wait_for
from server.playnode import placed, register, submit, sync

NUL = "\x00"
Req = Callable[[httpx.Client, dict[str, str]], httpx.Response]


@pytest.fixture(scope="module")
def world(server: Server) -> dict[str, str]:
    team = make_team(server)
    pool = make_pool(server)
    node, token = register(server, pool=pool, gpus=2)
    return {"team": team, "pool": pool, "node": node, "token": token}


def job(w: dict[str, str], **kw: Any) -> dict[str, Any]:
    return {"command": ["python", "train.py"], "gpus": 1, "pool": w["pool"], "team": w["team"], **kw}


PLAIN = {"content-type": "application/json"}  # the fast submit path takes these
SLOW = {"content-type": "application/json; charset=utf-8"}  # ... and leaves these to the route


def post_json(c: httpx.Client, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
    return c.post(path, content=json.dumps(body).encode(), headers=headers)


SUBMITS: list[tuple[str, Callable[[dict[str, str]], dict[str, Any]], str]] = [
    ("job-name", lambda w: job(w, name=f"a{NUL}b"), "name"),
    ("command", lambda w: job(w, command=["python", f"-c{NUL}"]), "command"),
    ("env-key", lambda w: job(w, env={f"K{NUL}": "v"}), "env"),
    ("env-value", lambda w: job(w, env={"K": f"v{NUL}"}), "env"),
    ("image", lambda w: job(w, image=f"img{NUL}"), "image"),
    ("output", lambda w: job(w, output=f"/tmp/o{NUL}"), "output"),
    ("gpu-type", lambda w: job(w, gpu_type=f"H100{NUL}"), "gpu_type"),
    ("time-limit", lambda w: job(w, time_limit=f"1h{NUL}"), "time_limit"),
    ("lone-surrogate", lambda w: job(w, name="a\udc80b"), "name"),
]


@pytest.mark.parametrize("headers", [PLAIN, SLOW], ids=["fast-path", "route"])
@pytest.mark.parametrize(("body", "where"), [(b, f) for _, b, f in SUBMITS], ids=[i for i, _, _ in SUBMITS])
def test_submit_with_nul_is_a_422_naming_the_field(
    server: Server,
    world: dict[str, str],
    body: Callable[[dict[str, str]], dict[str, Any]],
    where: str,
    headers: dict[str, str],
) -> None:
    before = server.counts()
    with server.client() as c:
        ok(c.get("/users/me"))  # the token is cached (the submit then skips the token look-up)
        resp = post_json(c, "/jobs", body(world), headers)
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    assert resp.json()["detail"].startswith(where)
    assert server.counts() == before


OTHERS: list[tuple[str, Req, int]] = [
    ("token-name", lambda c, w: c.post("/tokens", json={"name": f"t{NUL}"}), 422),
    ("pool-description", lambda c, w: c.post("/pools", json={"name": unique("p"), "description": NUL}), 422),
    ("cordon-reason", lambda c, w: c.post(f"/nodes/{w['node']}/cordon", json={"reason": f"r{NUL}"}), 422),
    ("drain-reason", lambda c, w: c.post(f"/nodes/{w['node']}/drain", json={"reason": f"r{NUL}"}), 422),
    (
        "reservation-name",
        lambda c, w: c.post(
            "/reservations", json={"start": 4e9, "duration_s": 60, "gpus": 1, "pool": w["pool"], "name": NUL}
        ),
        422,
    ),
    (
        "gpu-model-at-registration",
        lambda c, w: c.put(
            f"/nodes/{unique('n')}", json={"pool": w["pool"], "gpus": [{"index": 0, "model": NUL}]}
        ),
        422,
    ),
    (
        "gpu-uuid-in-sync",
        lambda c, w: c.post(
            f"/nodes/{w['node']}/sync", json={"gpus": [{"index": 0, "model": "H100", "uuid": f"G{NUL}"}]}
        ),
        422,
    ),
    ("address-in-sync", lambda c, w: c.post(f"/nodes/{w['node']}/sync", json={"address": f"h{NUL}"}), 422),
    (
        "telemetry-health",
        lambda c, w: c.post(f"/nodes/{w['node']}/sync", json={"telemetry": [{"index": 0, "health": [NUL]}]}),
        422,
    ),
    ("prices", lambda c, w: c.put("/prices", json={"base": {f"H100{NUL}": 1.0}}), 422),
    ("query", lambda c, w: c.get("/jobs", params={"user": f"a{NUL}"}), 400),
    ("path-node", lambda c, w: c.get("/nodes/a%00b"), 400),
    ("path-team", lambda c, w: c.get("/teams/a%00b"), 400),
    ("path-sync", lambda c, w: c.post("/nodes/a%00b/sync", json={"jobs": []}), 400),
]


@pytest.mark.parametrize(
    ("request_", "status"), [(r, s) for _, r, s in OTHERS], ids=[i for i, _, _ in OTHERS]
)
def test_nul_anywhere_else_is_a_4xx_problem_and_changes_nothing(
    server: Server, world: dict[str, str], request_: Req, status: int
) -> None:
    before = server.counts()
    with server.client() as c:
        resp = request_(c, world)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    assert "NUL" in resp.json()["detail"] or "Unicode" in resp.json()["detail"]
    assert server.counts() == before


def test_nul_in_job_output_is_stored_as_a_symbol_and_the_node_keeps_syncing(
    server: Server, world: dict[str, str]
) -> None:
    node, token = world["node"], world["token"]
    jid = submit(server, gpus=1, pool=world["pool"], team=world["team"])["id"]
    _, attempt = placed(server, jid)
    chunks = [f"a{NUL}b\n", "\udcff after\n"]
    offset = 0
    for data in chunks:
        end = offset + len(data.encode("utf-8", "surrogatepass"))
        reply = sync(
            server,
            node,
            {
                "jobs": [{"job_id": jid, "state": "running", "attempt": attempt}],
                "logs": [{"job_id": jid, "attempt": attempt, "offset": offset, "end": end, "data": data}],
            },
            token=token,
        )
        assert reply["log_acks"] == [{"job_id": jid, "attempt": attempt, "end": end}]
        offset = end
    wait_for(server, jid, "RUNNING")
    with server.client() as c:
        assert c.get(f"/jobs/{jid}/logs").text == "a\u2400b\n\ufffd after\n"
    reply = sync(
        server,
        node,
        {"jobs": [{"job_id": jid, "state": "exited", "exit_code": 0, "attempt": attempt}]},
        token=token,
    )
    assert reply["jobs"] == []
    assert wait_for(server, jid, "COMPLETED")["exit_code"] == 0
