"""GPU shares without MIG, black-box against the real server.

An operator marks a GPU shared (``PUT /v1/nodes/{name}/gpus/{index}/share``); it is no
longer handed out whole and takes jobs asking ``gpu_fraction`` / ``gpu_memory``: each
gets that many units (1 % of the GPU's compute and memory each, ``gpufleet.migindex``)
on one GPU, packed onto the GPU already shared before another; a share that no GPU has
room for waits. The switch is refused while a job holds the GPU, and for users; a failed
GPU requeues the jobs on its shares. Quotas: ``tests/test_core_shares.py``; the agent's
side (MPS limits in the job's environment): ``tests/agent/test_shares_env.py``."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy.orm import Session

from gpufleet import mig
from gpufleet.server.services import nodeops
from server.conftest import Server, every, make_pool, make_team, make_user, ok, unique
from server.playnode import placed, register, sync
from server.playnode import submit as submit_job

MADE: list[int] = []
"""Every job this module submits: cancelled at its end, so that on a shared PostgreSQL
its pending shares do not stand ahead of later modules' jobs in the fleet-wide queue."""


def submit(server: Server, **spec: Any) -> dict[str, Any]:
    job = submit_job(server, **spec)
    MADE.append(job["id"])
    return job


@pytest.fixture(scope="module", autouse=True)
def _cancel_at_the_end(server: Server) -> Any:
    yield
    if MADE:
        with server.client() as c:
            ok(c.post("/jobs/cancel", json={"ids": MADE}))
        MADE.clear()


def _share(server: Server, node: str, gpu: int, on: bool = True, token: str | None = None) -> Any:
    with server.client(token) if token else server.client() as c:
        return c.put(f"/nodes/{node}/gpus/{gpu}/share", json={"shared": on})


def _units(job: dict[str, Any]) -> tuple[str, int, int]:
    """(node, GPU, units) of a share job's allocation."""
    [a] = job["allocation"]
    found = {mig.share_of(i) for i in a["gpus"]}
    gpus = {f[0] for f in found if f is not None}
    assert len(gpus) == 1 and None not in found, a
    return a["node"], gpus.pop(), len(a["gpus"])


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


def test_shares_pack_onto_a_shared_gpu_and_never_make_it_whole(server: Server, team: str) -> None:
    pool = make_pool(server)
    node, token = register(server, pool=pool, gpus=3)
    for g in (1, 2):
        resp = _share(server, node, g)
        assert resp.status_code == 200, resp.text
        assert resp.json()["gpus"][g]["shared"] is True
    whole = submit(server, gpus=2, pool=pool, team=team)  # only GPU 0 is whole: it waits
    quarter = placed(server, submit(server, gpu_fraction=0.25, pool=pool, team=team)["id"])[0]
    assert quarter["gpus"] == 25 and quarter["gpu_type"] == "SHARED" and quarter["nodes"] == 1
    _, first, n = _units(quarter)
    assert n == 25
    half = placed(server, submit(server, gpu_fraction=0.5, pool=pool, team=team)["id"])[0]
    assert _units(half) == (node, first, 50)  # packed onto the GPU already shared
    big = placed(server, submit(server, gpu_fraction=0.3, pool=pool, team=team)["id"])[0]
    assert _units(big)[1] == 3 - first  # 25 + 50 + 30 > 100: the other shared GPU
    one = placed(server, submit(server, gpus=1, pool=pool, team=team)["id"])[0]
    assert one["allocation"] == [{"node": node, "gpus": [0]}]
    with server.client() as c:
        assert ok(c.get(f"/jobs/{whole['id']}"))["state"] == "PENDING"
        assert ok(c.get(f"/nodes/{node}"))["gpus_free"] == 0  # a shared GPU is never free whole
    desired = sync(server, node, {"jobs": []}, token=token)["jobs"]
    assert sorted(len(d["gpus"]) for d in desired) == [1, 25, 30, 50]
    # memory: 20G of an 80 GB GPU (81,920 MiB) is 25 units: exactly what the fuller GPU has left
    mem = placed(server, submit(server, gpu_memory="20G", pool=pool, team=team)["id"])[0]
    assert mem["gpu_type"].endswith("SHARED")
    assert _units(mem)[1:] == (first, 25)
    # no room for 0.9 on either: it waits
    with server.client() as c:
        waits = ok(
            c.post("/jobs", json={"command": ["x"], "gpu_fraction": 0.9, "pool": pool, "team": team}), 201
        )
        MADE.append(waits["id"])
        shown = ok(c.get(f"/jobs/{waits['id']}"))
    assert shown["state"] == "PENDING"


def test_switching_is_refused_while_a_job_holds_the_gpu_and_for_users(server: Server, team: str) -> None:
    pool = make_pool(server)
    node, _ = register(server, pool=pool, gpus=2)
    assert _share(server, node, 1).status_code == 200
    assert _share(server, node, 1).status_code == 200  # the same state again: nothing changes
    job = placed(server, submit(server, gpu_fraction=0.1, pool=pool, team=team)["id"])[0]
    resp = _share(server, node, 1, on=False)
    assert resp.status_code == 409 and f"runs job(s) {job['id']}" in resp.text, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    whole = placed(server, submit(server, gpus=1, pool=pool, team=team)["id"])[0]
    resp = _share(server, node, 0)
    assert resp.status_code == 409 and str(whole["id"]) in resp.text
    user = make_user(server, team=team)
    assert _share(server, node, 0, token=user).status_code == 403
    with server.client() as c:
        assert c.put(f"/nodes/{node}/gpus/9/share", json={"shared": True}).status_code == 404
        assert c.put(f"/nodes/{unique('no')}/gpus/0/share", json={"shared": True}).status_code == 404
        assert c.put(f"/nodes/{node}/gpus/0/share", json={"shared": "maybe"}).status_code == 422
        shown = ok(c.get(f"/nodes/{node}"))["gpus"]
        events = [e["kind"] for e in ok(c.get("/fleet/events", params={"node": node}))]
    assert [g["shared"] for g in shown] == [False, True]
    assert events.count("share-on") == 1
    with Session(server.engine) as s, s.begin():  # GPU 1 fails (a health rule's cordon does this)
        assert nodeops.requeue_on(s, node=node, gpu=1, now=time.time(), actor="test", reason="fell off") == 1
    with server.client() as c:
        assert ok(c.get(f"/jobs/{job['id']}"))["attempts"] == 1  # the share job, not the whole one
        assert ok(c.get(f"/jobs/{whole['id']}"))["attempts"] == 0


@pytest.mark.parametrize(
    ("spec", "status", "words"),
    [
        ({"gpu_fraction": 1.5}, 422, "gpu_fraction"),
        ({"gpu_fraction": 0}, 422, "gpu_fraction"),
        ({"gpu_fraction": 0.5, "gpus": 2}, 422, "part of one GPU"),
        ({"gpu_fraction": 0.5, "gpu_type": "A100"}, 422, "no shared A100 GPUs"),
        ({"gpu_type": "SHARED", "gpus": 101}, 422, "part of one GPU"),
    ],
)
def test_bad_share_asks_are_refused(
    server: Server, team: str, spec: dict[str, Any], status: int, words: str
) -> None:
    pool = make_pool(server)
    node, _ = register(server, pool=pool, gpus=1)
    assert _share(server, node, 0).status_code == 200
    with server.client() as c:
        resp = c.post("/jobs", json={"command": ["x"], "pool": pool, "team": team, **spec})
    assert resp.status_code == status and words in resp.text, resp.text


def test_a_pool_without_shared_gpus_says_so(server: Server, team: str) -> None:
    pool = make_pool(server)
    register(server, pool=pool, gpus=1)
    with server.client() as c:
        resp = c.post("/jobs", json={"command": ["x"], "gpu_fraction": 0.5, "pool": pool, "team": team})
    assert resp.status_code == 422 and "gpufleet node share" in resp.text, resp.text


def test_a_service_runs_its_replicas_on_shares(server: Server, team: str) -> None:
    """``gpu_fraction`` on a service: each replica is a share of a shared GPU (two quarter
    replicas on one GPU), shown as such; a fraction with several GPUs per replica is refused."""
    pool = make_pool(server)
    node, _ = register(server, pool=pool, gpus=2)
    assert _share(server, node, 1).status_code == 200
    name = unique("svc")
    spec = {"name": name, "command": ["x"], "replicas": 2, "gpu_fraction": 0.25, "pool": pool, "team": team}
    with server.client() as c:
        bad = c.put(f"/services/{name}", json={**spec, "gpus_per_replica": 2})
        assert bad.status_code == 422 and "gpus_per_replica 1" in bad.text, bad.text
        ok(c.put(f"/services/{name}", json=spec))
        deadline = time.monotonic() + 10
        while True:
            jobs = [j for j in every(c, "/jobs", pool=pool) if j["name"].startswith(name)]
            if (len(jobs) == 2 and all(j["allocation"] for j in jobs)) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        ok(c.delete(f"/services/{name}"), 202)
        deadline = time.monotonic() + 20  # gone before the next module: its drain moves no job there
        while c.get(f"/services/{name}").status_code != 404:
            assert time.monotonic() < deadline, "the service was not deleted"
            time.sleep(0.1)
    assert sorted(_units(j) for j in jobs) == [(node, 1, 25), (node, 1, 25)]
