"""Operators lay out a GPU with MIG; the node applies it; nothing runs on a MIG GPU whole.

Black-box against the real server: ``PUT /v1/nodes/{name}/gpus/{index}/mig`` checks the
layout against ``gpufleet.mig``'s table and cordons the GPU; a sync's reply carries the
change once no job holds the GPU; the node's ``MigResult`` lifts the cordon (applied) or
keeps it with the reason (failed); every step is a fleet event."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy.orm import Session

from gpufleet.server.services import nodeops
from server.conftest import Server, make_pool, make_team, make_user, ok, unique, wait_for
from server.playnode import eventually, join_token, metric, placed, submit, sync

MODEL = "NVIDIA H100 80GB HBM3"


def _gpus(
    node: str, n: int = 2, *, mig: dict[int, list[dict[str, Any]]] | None = None
) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        g: dict[str, Any] = {"index": i, "model": MODEL, "uuid": f"GPU-{node}-{i}", "mig_enabled": False}
        if mig is not None and i in mig:
            g |= {"mig_enabled": True, "mig_instances": mig[i]}
        out.append(g)
    return out


def _instance(node: str, gpu: int, profile: str, start: int, size: int, gi: int) -> dict[str, Any]:
    return {
        "uuid": f"MIG-{node}-{gpu}-{gi}",
        "profile": profile,
        "gpu_instance_id": gi,
        "compute_instance_id": 0,
        "start": start,
        "size": size,
        "memory_mb": size * 10_240,
    }


def _node(server: Server, pool: str, *, mig_on: bool | None = True) -> tuple[str, str]:
    """A 2-GPU H100 node; GPU 1 in MIG mode with one 7g instance (``mig_on``); with
    ``mig_on=None`` its agent says nothing of MIG (an older agent, or no NVML answer)."""
    name = unique("mig")
    mig = {1: [_instance(name, 1, "7g.80gb", 0, 8, 0)]} if mig_on else None
    gpus = _gpus(name, mig=mig)
    if mig_on is None:
        gpus = [{k: v for k, v in g.items() if k != "mig_enabled"} for g in gpus]
    with server.client() as c:
        ok(c.put(f"/nodes/{name}", json={"pool": pool, "gpus": _gpus(name)}))
    token = join_token(server, name)
    sync(server, name, {"gpus": gpus, "jobs": []}, token=token)
    return name, token


def _put(server: Server, node: str, gpu: int, body: dict[str, Any], *, token: str | None = None) -> Any:
    with server.client(token) if token else server.client() as c:
        return c.put(f"/nodes/{node}/gpus/{gpu}/mig", json=body)


def _shown(server: Server, node: str, gpu: int) -> dict[str, Any]:
    with server.client() as c:
        return ok(c.get(f"/nodes/{node}"))["gpus"][gpu]  # type: ignore[no-any-return]


def _events(server: Server, node: str) -> list[tuple[str, int | None, str]]:
    with server.client() as c:
        return [
            (e["kind"], e["gpu_index"], e["reason"])
            for e in ok(c.get("/fleet/events", params={"node": node}))
        ]


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


def test_a_layout_is_asked_sent_applied_and_the_gpu_back_in_service(server: Server) -> None:
    pool = make_pool(server)
    node, token = _node(server, pool)
    layout = ["2g.20gb", "2g.20gb", "3g.40gb"]
    resp = _put(server, node, 1, {"layout": layout})
    assert resp.status_code == 200, resp.text
    gpu = _shown(server, node, 1)
    assert (
        gpu["mig_pending"] == layout and gpu["cordoned"] and "2g.20gb,2g.20gb,3g.40gb" in gpu["cordon_reason"]
    )
    reply = sync(server, node, {"jobs": []}, token=token)
    assert reply["mig"] == [{"gpu": 1, "layout": layout}]
    done = [
        _instance(node, 1, "3g.40gb", 0, 4, 1),
        _instance(node, 1, "2g.20gb", 4, 2, 5),
        _instance(node, 1, "2g.20gb", 6, 2, 6),
    ]
    body = {"gpus": _gpus(node, mig={1: done}), "jobs": [], "mig_results": [{"gpu": 1, "layout": layout}]}
    reply = sync(server, node, body, token=token)
    assert reply["mig"] == []
    gpu = _shown(server, node, 1)
    assert gpu["mig_pending"] is None and gpu["mig_error"] is None and not gpu["cordoned"]
    assert [i["profile"] for i in gpu["mig_instances"]] == ["3g.40gb", "2g.20gb", "2g.20gb"]
    kinds = [(k, g) for k, g, _ in _events(server, node) if k.startswith("mig")]
    assert sorted(kinds) == [("mig-applied", 1), ("mig-asked", 1)]
    assert sync(server, node, {"jobs": []}, token=token)["mig"] == []  # asked once, answered once


def test_a_failed_layout_keeps_the_gpu_cordoned_with_the_reason(server: Server) -> None:
    node, token = _node(server, make_pool(server))
    assert _put(server, node, 1, {"layout": ["7g.80gb"]}).status_code == 200
    why = "no permission: changing MIG instances needs root"
    body = {"jobs": [], "mig_results": [{"gpu": 1, "layout": ["7g.80gb"], "error": why}]}
    assert sync(server, node, body, token=token)["mig"] == []  # not asked again
    gpu = _shown(server, node, 1)
    assert gpu["cordoned"] and why in gpu["cordon_reason"] and gpu["mig_error"] == why
    assert gpu["mig_pending"] is None
    assert any(k == "mig-failed" and why in r for k, _, r in _events(server, node))


def test_an_answer_about_an_older_request_changes_nothing(server: Server) -> None:
    node, token = _node(server, make_pool(server))
    assert _put(server, node, 1, {"layout": ["7g.80gb"]}).status_code == 200
    assert _put(server, node, 1, {"layout": ["3g.40gb", "3g.40gb"]}).status_code == 200
    body = {"jobs": [], "mig_results": [{"gpu": 1, "layout": ["7g.80gb"]}]}
    assert sync(server, node, body, token=token)["mig"] == [{"gpu": 1, "layout": ["3g.40gb", "3g.40gb"]}]
    assert _shown(server, node, 1)["mig_pending"] == ["3g.40gb", "3g.40gb"]


def test_the_change_waits_for_the_job_on_that_gpu(server: Server, team: str) -> None:
    pool = make_pool(server)
    node, token = _node(server, pool, mig_on=None)
    job, attempt = placed(server, submit(server, gpus=2, pool=pool, team=team)["id"])
    assert _put(server, node, 0, {"layout": ["7g.80gb"]}).status_code == 200
    running = {"jobs": [{"job_id": job["id"], "state": "running", "attempt": attempt}]}
    assert sync(server, node, running, token=token)["mig"] == []
    assert _shown(server, node, 0)["job_id"] == job["id"]
    ended = {"jobs": [{"job_id": job["id"], "state": "exited", "exit_code": 0, "attempt": attempt}]}
    assert sync(server, node, ended, token=token)["mig"] == [{"gpu": 0, "layout": ["7g.80gb"]}]
    wait_for(server, job["id"], "COMPLETED")


def test_a_mig_gpu_is_never_given_whole(server: Server, team: str) -> None:
    pool = make_pool(server)
    node, _ = _node(server, pool)  # GPU 1 is in MIG mode
    one = submit(server, gpus=1, pool=pool, team=team)
    job, _ = placed(server, one["id"])
    assert job["allocation"] == [{"node": node, "gpus": [0]}]
    two = submit(server, gpus=2, pool=pool, team=team)
    with server.client() as c:
        shown = ok(c.get(f"/jobs/{two['id']}"))
    assert shown["state"] == "PENDING"
    with server.client() as c:
        assert ok(c.get(f"/nodes/{node}"))["gpus_free"] == 0


@pytest.mark.parametrize(
    ("gpu", "body", "status", "words"),
    [
        (1, {"layout": ["3g.40gb", "3g.40gb", "1g.10gb"]}, 422, "3g.40gb"),
        (1, {"layout": ["5g.40gb"]}, 422, "5g.40gb"),
        (1, {"layout": ["1g.5gb"]}, 422, "1g.5gb"),  # an A100-40GB profile
        (1, {"layout": ["7g.80gb"], "whole": True}, 422, "not both"),
        (1, {}, 422, "not both"),
        (1, {"layout": []}, 422, "layout"),
        (7, {"layout": ["7g.80gb"]}, 404, "no GPU 7"),
        (0, {"layout": ["7g.80gb"]}, 409, "nvidia-smi -i 0 -mig 1"),
        (0, {"whole": True}, 409, "already whole"),
    ],
)
def test_bad_requests_are_refused_and_change_nothing(
    server: Server, gpu: int, body: dict[str, Any], status: int, words: str
) -> None:
    node, _ = _node(server, make_pool(server))
    before = _shown(server, node, min(gpu, 1))
    resp = _put(server, node, gpu, body)
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert words in resp.text
    assert _shown(server, node, min(gpu, 1)) == before
    assert not [k for k, _, _ in _events(server, node) if k.startswith("mig")]


def test_users_and_node_credentials_may_not_lay_out_gpus(server: Server, team: str) -> None:
    node, token = _node(server, make_pool(server))
    user = make_user(server, team=team)
    for who, status in ((user, 403), (token, 401)):  # a node credential is for its agent's calls only
        resp = _put(server, node, 1, {"layout": ["7g.80gb"]}, token=who)
        assert resp.status_code == status, resp.text
    assert _shown(server, node, 1)["mig_pending"] is None
    with server.client() as c:
        assert c.put(f"/nodes/{unique('nope')}/gpus/0/mig", json={"whole": True}).status_code == 404


def test_jobs_ask_for_slices_and_get_them_on_one_node(server: Server, team: str) -> None:
    """GPU 1 of the node is cut in 3g.40gb x2: two one-slice jobs get one slice each (by
    index SLICE_BASE + GPU x 8 + start), a third waits, a whole-GPU job gets GPU 0 and never
    a slice, and the node's sync hands each job its slice; a layout asked for that GPU
    waits while a slice is held."""
    pool = make_pool(server)
    name = unique("mig")
    slices = [_instance(name, 1, "3g.40gb", 0, 4, 1), _instance(name, 1, "3g.40gb", 4, 4, 2)]
    with server.client() as c:
        ok(c.put(f"/nodes/{name}", json={"pool": pool, "gpus": _gpus(name)}))
    token = join_token(server, name)
    sync(server, name, {"gpus": _gpus(name, mig={1: slices}), "jobs": []}, token=token)
    a, b = (submit(server, gpus=1, gpu_type="MIG 3g.40gb", pool=pool, team=team) for _ in range(2))
    got = sorted(placed(server, j["id"])[0]["allocation"][0]["gpus"][0] for j in (a, b))
    assert got == [1024 + 8, 1024 + 12]
    third = submit(server, gpus=1, gpu_type="MIG 3g.40gb", pool=pool, team=team)
    whole = submit(server, gpus=1, pool=pool, team=team)
    assert placed(server, whole["id"])[0]["allocation"] == [{"node": name, "gpus": [0]}]
    with server.client() as c:
        assert ok(c.get(f"/jobs/{third['id']}"))["state"] == "PENDING"
    desired = sync(server, name, {"jobs": []}, token=token)["jobs"]
    assert sorted(g for d in desired for g in d["gpus"]) == [0, 1032, 1036]
    labels = {"Hostname": name, "GPU_I_PROFILE": "3g.40gb"}
    assert eventually(lambda: metric(server, "gpufleet_mig_instance_allocated", **labels) == 2)
    assert metric(server, "gpufleet_mig_instance", **labels, GPU_I_ID="2") == 1
    assert _put(server, name, 1, {"layout": ["7g.80gb"]}).status_code == 200
    assert sync(server, name, {"jobs": []}, token=token)["mig"] == []  # its slices are held


def test_a_slice_job_is_one_nodes_and_asks_for_what_exists(server: Server, team: str) -> None:
    pool = make_pool(server)
    _node(server, pool)
    with server.client() as c:
        two_nodes = {
            "command": ["x"],
            "gpus": 2,
            "nodes": 2,
            "gpu_type": "MIG 7g.80gb",
            "pool": pool,
            "team": team,
        }
        resp = c.post("/jobs", json=two_nodes)
        assert resp.status_code == 422 and "one node" in resp.text, resp.text
        none = {"command": ["x"], "gpus": 1, "gpu_type": "MIG 1g.10gb", "pool": pool, "team": team}
        resp = c.post("/jobs", json=none)
        assert resp.status_code == 422 and "MIG 1g.10gb" in resp.text, resp.text
        fits = {"command": ["x"], "gpus": 1, "gpu_type": "MIG 7g.80gb", "pool": pool, "team": team}
        job = ok(c.post("/jobs", json=fits), 201)
    assert job["nodes"] == 1 and job["gpus_per_node"] == 1


def test_a_gpu_taken_out_requeues_the_jobs_on_its_slices(server: Server, team: str) -> None:
    """``requeue_on(gpu=1)`` (what a health rule's GPU cordon does) takes the jobs on GPU 1's
    MIG slices with it, and leaves the job on GPU 0."""
    pool = make_pool(server)
    name = unique("mig")
    with server.client() as c:
        ok(c.put(f"/nodes/{name}", json={"pool": pool, "gpus": _gpus(name)}))
    token = join_token(server, name)
    gpus = _gpus(name, mig={1: [_instance(name, 1, "7g.80gb", 0, 8, 1)]})
    sync(server, name, {"gpus": gpus, "jobs": []}, token=token)
    on_slice = placed(server, submit(server, gpus=1, gpu_type="MIG 7g.80gb", pool=pool, team=team)["id"])[0]
    on_gpu = placed(server, submit(server, gpus=1, pool=pool, team=team)["id"])[0]
    with Session(server.engine) as s, s.begin():
        assert (
            nodeops.requeue_on(s, node=name, gpu=1, now=time.time(), actor="test", reason="GPU 1 fell off")
            == 1
        )
    with server.client() as c:
        assert ok(c.get(f"/jobs/{on_slice['id']}"))["state"] in ("PENDING", "SCHEDULED")
        assert ok(c.get(f"/jobs/{on_slice['id']}"))["attempts"] == 1
        assert ok(c.get(f"/jobs/{on_gpu['id']}"))["attempts"] == 0


@pytest.mark.parametrize(
    ("extra", "status", "got"),
    [
        ({"gpu_memory": "20G"}, 201, "MIG 3g.40gb"),  # the smallest device with 20 GB: a 3g.40gb slice
        ({"gpu_memory": 40960}, 201, "MIG 3g.40gb"),
        ({"gpu_memory": "50G"}, 201, MODEL),  # no slice that large: a whole GPU
        ({"gpu_memory": "100G"}, 422, "no GPU or MIG slice"),
        ({"gpu_memory": "banana"}, 422, "gpu_memory=banana"),
        ({"gpu_memory": "20G", "gpu_type": "H100"}, 422, "not both"),
    ],
)
def test_gpu_memory_asks_for_the_smallest_device_that_has_it(
    server: Server, team: str, extra: dict[str, Any], status: int, got: str
) -> None:
    pool = make_pool(server)
    name = unique("mig")
    with server.client() as c:
        ok(c.put(f"/nodes/{name}", json={"pool": pool, "gpus": _gpus(name)}))
    token = join_token(server, name)
    slices = [_instance(name, 1, "3g.40gb", 0, 4, 1), _instance(name, 1, "3g.40gb", 4, 4, 2)]
    sync(server, name, {"gpus": _gpus(name, mig={1: slices}), "jobs": []}, token=token)
    with server.client() as c:
        resp = c.post("/jobs", json={"command": ["x"], "pool": pool, "team": team, **extra})
    assert resp.status_code == status, resp.text
    if status == 201:
        job = resp.json()
        assert job["gpu_type"] == got
        assert placed(server, job["id"])[0]["allocation"][0]["node"] == name
    else:
        assert got in resp.text


def test_a_racks_gpus_count_a_mig_gpu_once(server: Server) -> None:
    """``GET /v1/racks`` (the page's rack power table): a GPU in MIG mode is one GPU of
    its rack, not one more per slice (a demo rack with a MIG node once showed 173 GPUs
    on 20 nodes of 8)."""
    pool, rack = make_pool(server), unique("rack")
    name = unique("mig")
    with server.client() as c:
        ok(c.put(f"/nodes/{name}", json={"pool": pool, "rack": rack, "gpus": _gpus(name)}))
    token = join_token(server, name)
    slices = [_instance(name, 1, "1g.10gb", start, 1, start) for start in range(7)]
    sync(server, name, {"gpus": _gpus(name, mig={1: slices}), "jobs": []}, token=token)
    with server.client() as c:
        shown = ok(c.get(f"/nodes/{name}"))
        (got,) = [r for r in ok(c.get("/racks"))["items"] if r["rack"] == rack]
    assert shown["gpus"][1]["mig_enabled"], shown["gpus"][1]
    assert (got["nodes"], got["gpus"], got["busy_gpus"]) == (1, 2, 0), got
