"""Names as long as the API accepts fit every column they go into (PostgreSQL checks
lengths; SQLite does not, so these matter there most).

Node names are at most 63 characters of ``[A-Za-z0-9][A-Za-z0-9._-]*`` (a host name's
first label, what the agent uses by default); longer or odder ones are a 422 on every
path that creates or changes a node. The longest accepted names then run multi-node
jobs through node credentials (job events name ``node:<name>``; ``stopping_on`` joins
the names) and cancel them."""

from __future__ import annotations

import time
from typing import Any

import pytest

from server.conftest import Server, make_pool, make_team, ok, unique, wait_for
from server.playnode import join_token, placed, post_sync, submit, sync

LONGEST = 63
ONE_GPU = [{"index": 0, "model": "H100", "uuid": "GPU-0"}]


def long_name(length: int) -> str:
    base = unique("n").replace("x", "-")
    return (base + "-" + "a" * length)[:length]


@pytest.fixture(scope="module")
def team(server: Server) -> str:
    return make_team(server)


@pytest.mark.parametrize("nodes", [2, 3], ids=["2-nodes", "3-nodes"])
def test_longest_node_names_run_and_cancel_a_multi_node_job(server: Server, team: str, nodes: int) -> None:
    pool = make_pool(server)
    names = [long_name(LONGEST) for _ in range(nodes)]
    assert all(len(n) == LONGEST for n in names)
    tokens = {}
    for n in names:
        with server.client() as c:
            ok(c.put(f"/nodes/{n}", json={"pool": pool, "gpus": ONE_GPU}))
        tokens[n] = join_token(server, n)
        sync(server, n, {"gpus": ONE_GPU, "jobs": []}, token=tokens[n])
    job, attempt = placed(server, submit(server, gpus=nodes, gpus_per_node=1, pool=pool, team=team)["id"])
    for n in names:
        reply = sync(
            server,
            n,
            {"jobs": [{"job_id": job["id"], "state": "running", "attempt": attempt}]},
            token=tokens[n],
        )
        assert [d["job_id"] for d in reply["jobs"]] == [job["id"]]
    running = wait_for(server, job["id"], "RUNNING")
    assert running["events"][-1]["actor"] == f"node:{names[0]}"
    with server.client() as c:
        assert ok(c.post(f"/jobs/{job['id']}/cancel"))["state"] == "CANCELLED"
    for n in names:  # each node confirms the stop
        assert sync(server, n, {"jobs": []}, token=tokens[n])["jobs"] == []
    with server.client() as c:
        assert c.get(f"/jobs/{job['id']}/logs", params={"follow": "true"}).text == ""


BAD_NODE_NAMES = [
    ("64-characters", "a" * 64),
    ("200-characters", "b" * 200),
    ("comma", "a,b"),
    ("space", "a b"),
    ("leading-dot", ".a"),
    ("non-ascii", "nœud"),
]
WRITES: list[tuple[str, Any]] = [
    ("sync", lambda c, srv, name: post_sync(srv, name, {"gpus": ONE_GPU, "jobs": []})),
    ("register", lambda c, srv, name: c.put(f"/nodes/{name}", json={"gpus": []})),
    ("join-token", lambda c, srv, name: c.post("/nodes/join-tokens", json={"node": name})),
    ("cordon", lambda c, srv, name: c.post(f"/nodes/{name}/cordon", json={})),
    ("drain", lambda c, srv, name: c.post(f"/nodes/{name}/drain", json={})),
    ("uncordon", lambda c, srv, name: c.post(f"/nodes/{name}/uncordon", json={})),
    ("rollout", lambda c, srv, name: c.post("/rollouts", json={"nodes": [name]})),
]


@pytest.mark.parametrize("write", [w for _, w in WRITES], ids=[i for i, _ in WRITES])
@pytest.mark.parametrize("name", [n for _, n in BAD_NODE_NAMES], ids=[i for i, _ in BAD_NODE_NAMES])
def test_node_names_beyond_the_limit_are_a_422(server: Server, name: str, write: Any) -> None:
    before = server.counts()
    with server.client() as c:
        resp = write(c, server, name)
    assert resp.status_code == 422, resp.text
    assert resp.headers["content-type"] == "application/problem+json"
    assert server.counts() == before


def test_longest_repeated_reservation_name_fits(server: Server, team: str) -> None:
    pool = make_pool(server)
    name = long_name(LONGEST)
    with server.client() as c:
        ok(c.put(f"/nodes/{name}", json={"pool": pool, "gpus": ONE_GPU}))
        spec = {
            "start": time.time() + 86_400,
            "duration_s": 3600,
            "gpus": 1,
            "pool": pool,
            "name": "r" * 128,
            "repeat": "daily",
            "count": 12,
        }
        made = ok(c.post("/reservations", json=spec), 201)
    assert [len(r["name"]) for r in made] == [128] * 12
    assert len({r["name"] for r in made}) == 12
