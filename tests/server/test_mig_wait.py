"""A job asking for slices that a pending MIG layout will make waits for it (issue 30).

Black-box against the real server, the node's syncs by hand (so the test decides when
the layout is applied): right after ``PUT .../mig`` a job for the new profile is accepted
and waits with the reason naming the node and the layout; once the node reports the
layout applied it runs on a slice. A profile that no node has and no pending layout
makes is still refused at once (422). A layout the node refuses leaves the job to the
core's reason (no pending layout any more). A service's replica on such slices says the
same in ``service show``. A GPU share is the server's alone: a job
asking for one right after ``node share`` is accepted."""

from __future__ import annotations

from typing import Any

import pytest

from server.conftest import Server, make_pool, make_team, ok, unique
from server.playnode import eventually, join_token, placed, register, sync

MODEL = "NVIDIA H100 80GB HBM3"
SEVEN = ["1g.10gb"] * 7


def _gpus(node: str, *, instances: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GPU 0 whole, GPU 1 in MIG mode with ``instances``."""
    return [
        {"index": 0, "model": MODEL, "uuid": f"GPU-{node}-0", "mig_enabled": False},
        {
            "index": 1,
            "model": MODEL,
            "uuid": f"GPU-{node}-1",
            "mig_enabled": True,
            "mig_instances": instances,
        },
    ]


def _slice(node: str, profile: str, start: int, size: int) -> dict[str, Any]:
    return {
        "uuid": f"MIG-{node}-{profile}-{start}",
        "profile": profile,
        "gpu_instance_id": start + 1,
        "compute_instance_id": 0,
        "start": start,
        "size": size,
        "memory_mb": size * 10_240,
    }


def _node(server: Server, pool: str) -> tuple[str, str]:
    name = unique("mw")
    with server.client() as c:
        ok(c.put(f"/nodes/{name}", json={"pool": pool, "gpus": []}))
    token = join_token(server, name)
    sync(
        server,
        name,
        {"gpus": _gpus(name, instances=[_slice(name, "7g.80gb", 0, 8)]), "jobs": []},
        token=token,
    )
    return name, token


def _job(server: Server, job_id: int) -> dict[str, Any]:
    with server.client() as c:
        return ok(c.get(f"/jobs/{job_id}"))  # type: ignore[no-any-return]


def _submit(server: Server, *, pool: str, team: str, gpu_type: str, gpus: int = 2) -> Any:
    with server.client() as c:
        return c.post(
            "/jobs",
            json={"command": ["true"], "pool": pool, "team": team, "gpus": gpus, "gpu_type": gpu_type},
        )


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


def test_a_job_for_a_pending_layout_waits_for_it_then_runs(server: Server, team: str) -> None:
    pool = make_pool(server)
    node, token = _node(server, pool)
    with server.client() as c:
        ok(c.put(f"/nodes/{node}/gpus/1/mig", json={"layout": SEVEN}))
    made = _submit(server, pool=pool, team=team, gpu_type="MIG 1g.10gb")
    assert made.status_code == 201, made.text
    jid = made.json()["id"]
    want = f"MIGLayout: waiting for {node}'s MIG layout (1g.10gb x7) to take effect"
    got = eventually(lambda: _job(server, jid)["wait_reason"] == want and _job(server, jid), timeout=30)
    assert got and got["state"] == "PENDING", _job(server, jid)
    # a profile no node has and no pending layout makes: refused at once, as before
    refused = _submit(server, pool=pool, team=team, gpu_type="MIG 2g.20gb")
    assert refused.status_code == 422 and "cannot ever run" in refused.text, refused.text
    # more slices than the layout makes on one node: refused too
    assert _submit(server, pool=pool, team=team, gpu_type="MIG 1g.10gb", gpus=8).status_code == 422
    # the node applies it: the job runs on two of the new slices
    done = [_slice(node, "1g.10gb", s, 1) for s in range(7)]
    body = {"gpus": _gpus(node, instances=done), "jobs": [], "mig_results": [{"gpu": 1, "layout": SEVEN}]}
    sync(server, node, body, token=token)
    job, _ = placed(server, jid)
    assert job["allocation"][0]["node"] == node and len(job["allocation"][0]["gpus"]) == 2, job


def test_a_refused_layout_leaves_the_job_to_the_cores_reason(server: Server, team: str) -> None:
    pool = make_pool(server)
    node, token = _node(server, pool)
    with server.client() as c:
        ok(c.put(f"/nodes/{node}/gpus/1/mig", json={"layout": ["3g.40gb", "3g.40gb"]}))
    made = _submit(server, pool=pool, team=team, gpu_type="MIG 3g.40gb", gpus=1)
    assert made.status_code == 201, made.text
    jid = made.json()["id"]
    assert eventually(lambda: (_job(server, jid)["wait_reason"] or "").startswith("MIGLayout: "), timeout=30)
    why = "no permission"
    body = {"jobs": [], "mig_results": [{"gpu": 1, "layout": ["3g.40gb", "3g.40gb"], "error": why}]}
    sync(server, node, body, token=token)
    reason = eventually(
        lambda: not _job(server, jid)["wait_reason"].startswith("MIGLayout") and _job(server, jid)
    )
    assert reason and reason["state"] == "PENDING" and "3g.40gb" in reason["wait_reason"], _job(server, jid)


def test_a_share_is_in_effect_when_node_share_returns(server: Server, team: str) -> None:
    """The submit check keeps a pool's fleet for a few seconds; a refusal is confirmed on
    a fresh one, so the share an operator just made is there (issue 30: a submit right
    after ``node share`` was a 422)."""
    pool = make_pool(server)
    node, _ = register(server, pool=pool, gpus=1)
    ask = {"command": ["true"], "pool": pool, "team": team, "gpu_fraction": 0.5}
    with server.client() as c:
        assert c.post("/jobs", json=ask).status_code == 422  # no shared GPU yet: the fleet is kept
        ok(c.put(f"/nodes/{node}/gpus/0/share", json={"shared": True}))
        made = c.post("/jobs", json=ask)
    assert made.status_code == 201 and made.json()["gpu_type"] == "SHARED", made.text


def test_a_replica_on_slices_of_a_pending_layout_says_what_it_waits_for(server: Server, team: str) -> None:
    pool = make_pool(server)
    node, _ = _node(server, pool)
    name = unique("mwsvc")
    spec = {"name": name, "team": team, "pool": pool, "command": ["serve"], "gpu_type": "MIG 1g.10gb"}
    with server.client() as c:
        ok(c.put(f"/nodes/{node}/gpus/1/mig", json={"layout": SEVEN}))
        ok(c.put(f"/services/{name}", json=spec))
        want = f"MIGLayout: waiting for {node}'s MIG layout (1g.10gb x7) to take effect"
        shown = eventually(
            lambda: [r["reason"] for r in ok(c.get(f"/services/{name}"))["replicas"]] == [want], timeout=30
        )
        assert shown, ok(c.get(f"/services/{name}"))["replicas"]
        assert c.delete(f"/services/{name}").status_code == 202
