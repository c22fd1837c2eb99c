"""Bad input of every kind: a 4xx problem+json with a human detail, and no row changed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from server.conftest import Server, make_node, make_pool, make_team, ok

Req = Callable[[httpx.Client, dict[str, str]], httpx.Response]


def job(**kw: Any) -> dict[str, Any]:
    return {"command": ["python", "train.py"], "gpus": 1, **kw}


@pytest.fixture(scope="module")
def world(server: Server) -> dict[str, str]:
    team = make_team(server)
    gpu_pool = make_pool(server)
    cpu_pool = make_pool(server, gpu=False)
    make_node(server, pool=gpu_pool, gpus=4)
    make_node(server, pool=gpu_pool, gpus=4)
    return {"team": team, "gpu": gpu_pool, "cpu": cpu_pool}


BAD: list[tuple[str, Req, int]] = [
    ("negative-gpus", lambda c, w: c.post("/jobs", json=job(gpus=-1, team=w["team"])), 422),
    # issue 31: 0 GPUs in a GPU pool is Slurm's default now (CPUs only); these are not
    (
        "bad-constraint",
        lambda c, w: c.post("/jobs", json=job(constraint="a&", team=w["team"], pool=w["gpu"])),
        422,
    ),
    (
        "feature-no-node-has",
        lambda c, w: c.post("/jobs", json=job(constraint="nvlink9", team=w["team"], pool=w["gpu"])),
        422,
    ),
    (
        "partition-list-unknown",
        lambda c, w: c.post("/jobs", json=job(pool=f"{w['gpu']},nope", team=w["team"])),
        422,
    ),
    ("exclude-not-a-name", lambda c, w: c.post("/jobs", json=job(exclude=["a b"], team=w["team"])), 422),
    ("mem-and-per-cpu", lambda c, w: c.post("/jobs", json=job(mem=0, mem_per_cpu="1G", team=w["team"])), 422),
    ("gpus-in-cpu-pool", lambda c, w: c.post("/jobs", json=job(gpus=1, team=w["team"], pool=w["cpu"])), 422),
    (
        "more-gpus-than-fleet",
        lambda c, w: c.post("/jobs", json=job(gpus=9, team=w["team"], pool=w["gpu"])),
        422,
    ),
    (
        "per-node-too-big",
        lambda c, w: c.post("/jobs", json=job(gpus=5, gpus_per_node=5, team=w["team"], pool=w["gpu"])),
        422,
    ),
    (
        "unknown-gpu-type",
        lambda c, w: c.post("/jobs", json=job(gpu_type="B200", team=w["team"], pool=w["gpu"])),
        422,
    ),
    ("unknown-pool", lambda c, w: c.post("/jobs", json=job(pool="nope", team=w["team"])), 422),
    ("unknown-team", lambda c, w: c.post("/jobs", json=job(team="no-such-team")), 422),
    ("malformed-time", lambda c, w: c.post("/jobs", json=job(time_limit="soon", team=w["team"])), 422),
    ("negative-time", lambda c, w: c.post("/jobs", json=job(time_limit=-5, team=w["team"])), 422),
    ("unknown-field", lambda c, w: c.post("/jobs", json=job(gpuz=2, team=w["team"])), 422),
    ("wrong-type", lambda c, w: c.post("/jobs", json=job(gpus="many", team=w["team"])), 422),
    ("empty-command", lambda c, w: c.post("/jobs", json=job(command=[], team=w["team"])), 422),
    ("command-not-list", lambda c, w: c.post("/jobs", json=job(command="ls", team=w["team"])), 422),
    ("not-an-object", lambda c, w: c.post("/jobs", json=[1, 2]), 422),
    (
        "bad-json",
        lambda c, w: c.post("/jobs", content=b'{"command": [', headers={"content-type": "application/json"}),
        400,
    ),
    (
        "huge-payload",
        lambda c, w: c.post(
            "/jobs",
            json=job(env={"X": "y" * 60_000}, command=["a"] * 20, name="x", team=w["team"])
            | {"pad": "z" * (1 << 20)},
        ),
        413,
    ),
    ("bad-priority", lambda c, w: c.put("/jobs/1/priority", json={"priority": "high"}), 422),
    (
        "node-dup-gpu",
        lambda c, w: c.put(
            "/nodes/dup",
            json={"pool": w["gpu"], "gpus": [{"index": 0, "model": "H100"}, {"index": 0, "model": "H100"}]},
        ),
        422,
    ),
    (
        "node-mixed-models",
        lambda c, w: c.put(
            "/nodes/mix",
            json={"pool": w["gpu"], "gpus": [{"index": 0, "model": "H100"}, {"index": 1, "model": "A100"}]},
        ),
        422,
    ),
    ("node-unknown-pool", lambda c, w: c.put("/nodes/x", json={"pool": "nope", "gpus": []}), 422),
    (
        "node-negative-index",
        lambda c, w: c.put("/nodes/x", json={"gpus": [{"index": -1, "model": "H100"}]}),
        422,
    ),
    ("sync-unknown-node-no-gpus", lambda c, w: c.post("/nodes/ghost/sync", json={"jobs": []}), 404),
    (
        "sync-bad-state",
        lambda c, w: c.post("/nodes/ghost/sync", json={"jobs": [{"job_id": 1, "state": "zombie"}]}),
        422,
    ),
    (
        "quota-limit-below-nominal",
        lambda c, w: c.put(f"/teams/{w['team']}/quota", json={"gpus": 8, "limit": 4}),
        422,
    ),
    ("quota-negative", lambda c, w: c.put(f"/teams/{w['team']}/quota", json={"gpus": -1}), 422),
    ("duplicate-team", lambda c, w: c.post("/teams", json={"name": w["team"]}), 409),
    ("bad-team-name", lambda c, w: c.post("/teams", json={"name": "has space"}), 422),
    ("user-bad-role", lambda c, w: c.post("/users", json={"name": "eve", "role": "root"}), 422),
    ("user-unknown-team", lambda c, w: c.post("/users", json={"name": "eve", "teams": ["nope"]}), 422),
    ("list-bad-state", lambda c, w: c.get("/jobs", params={"state": "SLEEPING"}), 422),
    ("list-bad-limit", lambda c, w: c.get("/jobs", params={"limit": 0}), 422),
    ("job-id-not-int", lambda c, w: c.get("/jobs/abc"), 422),
    ("unknown-job", lambda c, w: c.get("/jobs/999999"), 404),
    ("unknown-route", lambda c, w: c.get("/nope"), 404),
    ("wrong-method", lambda c, w: c.delete("/jobs"), 405),
    ("no-token", lambda c, w: httpx.post(str(c.base_url).rstrip("/") + "/jobs", json=job()), 401),
    (
        "bad-token",
        lambda c, w: httpx.post(
            str(c.base_url).rstrip("/") + "/jobs", json=job(), headers={"Authorization": "Bearer nope"}
        ),
        401,
    ),
    (
        "bad-scheme",
        lambda c, w: httpx.get(
            str(c.base_url).rstrip("/") + "/jobs", headers={"Authorization": "Basic eA=="}
        ),
        401,
    ),
]


@pytest.mark.parametrize(("request_", "status"), [(r, s) for _, r, s in BAD], ids=[i for i, _, _ in BAD])
def test_bad_input_is_a_problem_and_changes_nothing(
    server: Server, world: dict[str, str], request_: Req, status: int
) -> None:
    before = server.counts()
    with server.client() as c:
        resp = request_(c, world)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    body = resp.json()
    assert body["status"] == status
    assert {"type", "title", "status", "detail", "instance"} <= set(body)
    assert isinstance(body["detail"], str) and body["detail"]
    if status == 422 and resp.request.url.path.endswith("/jobs") and "errors" in body:
        assert body["errors"][0]["loc"]
    assert server.counts() == before


def test_validation_problem_lists_every_error(server: Server, world: dict[str, str]) -> None:
    with server.client() as c:
        body = c.post("/jobs", json={"command": [], "gpus": -2, "extra": 1}).json()
    assert {tuple(e["loc"]) for e in body["errors"]} == {
        ("body", "command"),
        ("body", "gpus"),
        ("body", "extra"),
    }


def test_health_and_openapi(server: Server) -> None:
    assert httpx.get(server.url + "/v1/healthz").json()["status"] == "ok"
    assert httpx.get(server.url + "/v1/readyz").json()["status"] == "ready"
    spec = httpx.get(server.url + "/openapi.json").json()
    assert "/v1/jobs" in spec["paths"]
    assert "/v1/nodes/{name}/sync" in spec["paths"]


def test_tokens_own_list_and_revoke(server: Server, world: dict[str, str]) -> None:
    from server.conftest import make_user

    token = make_user(server, team=world["team"])
    with server.client(token) as c:
        me = ok(c.get("/users/me"))
        new = ok(c.post("/tokens", json={"name": "laptop"}), 201)
        mine = ok(c.get("/tokens"))["items"]
        assert {t["user"] for t in mine} == {me["name"]}
        assert "token" not in mine[0]
        assert c.post("/tokens", json={"user": "admin"}).status_code == 403
    with server.client(new["token"]) as c:
        ok(c.delete(f"/tokens/{new['id']}"))
        assert c.get("/users/me").status_code == 401
