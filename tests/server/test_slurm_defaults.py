"""Slurm's defaults and the options real scripts use (issue 31), black-box on a running
server: no GPU unless asked, the operator's default pool, pool lists, ``--exclusive`` and
``--mem=0`` on nodes that report a real machine's CPUs and memory, node features and
labels for ``--constraint``, ``--exclude``."""

from __future__ import annotations

import time
from typing import Any

import pytest

from server.conftest import Server, make_pool, make_team, ok, unique, wait_for
from server.playnode import gpu_list, register, sync

BIG_MEM = 2 * 1024 * 1024  # 2T, MiB


def post(srv: Server, status: int = 201, **spec: Any) -> Any:
    with srv.client() as c:
        return ok(c.post("/jobs", json={"command": ["true"], **spec}), status)


def machine(
    srv: Server, pool: str, *, gpus: int = 8, cpus: int = 224, features: list[str] | None = None
) -> str:
    """A node as its agent reports a real machine: 8 GPUs, 224 CPUs, 2T of memory."""
    name, token = register(srv, pool=pool, gpus=gpus)
    body: dict[str, Any] = {"gpus": gpu_list(gpus, node=name), "jobs": [], "cpus": cpus, "memory_mb": BIG_MEM}
    if features is not None:
        body["features"] = features
    sync(srv, name, body, token=token)
    SEEN[name] = (token, body)
    return name


SEEN: dict[str, tuple[str, dict[str, Any]]] = {}
"""node -> (its credential, its sync body): each test syncs them again (a node unseen for
30 s is NotReady, and this module takes longer than that on a busy machine), which also
confirms that the jobs cancelled before it no longer run there (their CPUs and memory
are free again)."""


@pytest.fixture(autouse=True)
def _alive(server: Server) -> None:
    for name, (token, body) in list(SEEN.items()):
        sync(server, name, body, token=token)


@pytest.fixture(scope="module")
def world(server: Server) -> dict[str, str]:
    team = make_team(server)
    pool = make_pool(server)
    SEEN.clear()  # a new server (this module runs once on each database)
    ib = machine(server, pool, features=["ib", "rack1"])
    plain = machine(server, pool, features=["rack2"])
    return {"team": team, "pool": pool, "ib": ib, "plain": plain}


def cancel(srv: Server, *ids: int) -> None:
    with srv.client() as c:
        ok(c.post("/jobs/cancel", json={"ids": list(ids)}))


def placed_on(srv: Server, job_id: int) -> tuple[str, list[int]]:
    job = wait_for(srv, job_id, "SCHEDULED")
    ((alloc,),) = (job["allocation"],)
    cancel(srv, job_id)
    return alloc["node"], alloc["gpus"]


def test_a_job_that_asks_no_gpu_gets_none_and_runs_on_a_gpu_node(
    server: Server, world: dict[str, str]
) -> None:
    job = post(server, pool=world["pool"], team=world["team"], cpus_per_task=4)
    assert job["gpus"] == 0
    node, gpus = placed_on(server, job["id"])
    assert node in (world["ib"], world["plain"]) and gpus == []


def test_a_gpu_count_another_way_still_counts(server: Server, world: dict[str, str]) -> None:
    """gpus left at 0 with gpus_per_node, or a GPU model: GPUs, as asked."""
    per_node = post(server, pool=world["pool"], team=world["team"], gpus_per_node=2, nodes=2)
    typed = post(server, pool=world["pool"], team=world["team"], gpu_type="H100")
    assert (per_node["gpus"], typed["gpus"]) == (4, 1)
    cancel(server, per_node["id"], typed["id"])


def test_the_default_pool_takes_jobs_that_name_none(server: Server, world: dict[str, str]) -> None:
    name = unique("dflt")
    with server.client() as c:
        made = ok(c.post("/pools", json={"name": name, "default": True}), 201)
        try:
            assert made["default"] is True
            job = post(server, team=world["team"])
            assert job["pool"] == name
            ok(c.patch(f"/pools/{world['pool']}", json={"default": True}))
            pools = {p["name"]: p["default"] for p in ok(c.get("/pools", params={"limit": 1000}))["items"]}
            assert pools[world["pool"]] and not pools[name]  # one default at most
            assert post(server, team=world["team"])["pool"] == world["pool"]
        finally:  # the session's other tests submit without a pool
            ok(c.patch(f"/pools/{world['pool']}", json={"default": False}))
            ok(c.patch(f"/pools/{name}", json={"default": False}))
        assert post(server, team=world["team"])["pool"] == "default"  # none marked: pool default
        cancel(server, job["id"])


def test_an_unknown_partition_is_refused_in_slurms_words(server: Server, world: dict[str, str]) -> None:
    got = post(server, 422, pool=f"{world['pool']},nope", team=world["team"])
    assert "invalid partition specified: nope" in got["detail"]


def test_a_pool_list_takes_the_first_that_can_run_the_job(server: Server, world: dict[str, str]) -> None:
    small = make_pool(server)
    machine(server, small, gpus=2)
    wide = post(server, pool=f"{small},{world['pool']}", team=world["team"], gpus_per_node=8)
    narrow = post(server, pool=f"{small},{world['pool']}", team=world["team"], gpus=1)
    assert (wide["pool"], narrow["pool"]) == (world["pool"], small)
    cancel(server, wide["id"], narrow["id"])


def test_exclusive_is_the_whole_node_gpus_cpus_and_memory(server: Server, world: dict[str, str]) -> None:
    job = post(server, pool=world["pool"], team=world["team"], exclusive=True)
    assert (job["gpus"], job["gpus_per_node"], job["nodes"]) == (8, 8, 1)
    assert (job["cpus_per_node"], job["mem_per_node_mb"]) == (224, BIG_MEM)
    _, gpus = placed_on(server, job["id"])
    assert gpus == list(range(8))


def test_mem_0_is_all_of_each_nodes_memory(server: Server, world: dict[str, str]) -> None:
    job = post(server, pool=world["pool"], team=world["team"], gpus=1, mem=0)
    assert job["mem_per_node_mb"] == BIG_MEM
    cancel(server, job["id"])


@pytest.mark.parametrize(
    ("constraint", "where"),
    [
        ("ib", "ib"),
        ("rack2", "plain"),
        ("ib&rack1", "ib"),
        ("(nope|rack2)&H100", "plain"),
        ("[nope|rack1]", "ib"),
    ],
    ids=["agent-feature", "other-node", "and", "or-and-gpu-model", "matching-or"],
)
def test_a_constraint_places_the_job_on_a_node_with_its_features(
    server: Server, world: dict[str, str], constraint: str, where: str
) -> None:
    job = post(server, pool=world["pool"], team=world["team"], gpus=8, constraint=constraint)
    assert placed_on(server, job["id"])[0] == world[where]


def test_operators_label_nodes_and_constraints_match_the_labels(
    server: Server, world: dict[str, str]
) -> None:
    label = unique("gpu80")
    with server.client() as c:
        node = ok(c.post(f"/nodes/{world['plain']}/labels", json={"add": [label]}))
        assert label in node["labels"] and node["features"] == ["rack2"]
        try:
            job = post(server, pool=world["pool"], team=world["team"], gpus=1, constraint=label)
            assert placed_on(server, job["id"])[0] == world["plain"]
            cpu = post(server, pool=world["pool"], team=world["team"], constraint=label)  # 0 GPUs too
            assert placed_on(server, cpu["id"])[0] == world["plain"]
        finally:
            node = ok(c.post(f"/nodes/{world['plain']}/labels", json={"remove": [label]}))
        assert label not in node["labels"]
        user = ok(c.post("/users", json={"name": unique("u"), "role": "user", "teams": [world["team"]]}), 201)
    with server.client(user["token"]) as mine:
        refused = mine.post(f"/nodes/{world['plain']}/labels", json={"add": ["x"]})
    assert refused.status_code == 403


def test_exclude_keeps_a_job_off_the_nodes_it_names(server: Server, world: dict[str, str]) -> None:
    for avoid, other in (("ib", "plain"), ("plain", "ib")):
        job = post(server, pool=world["pool"], team=world["team"], gpus=8, exclude=[world[avoid]])
        assert placed_on(server, job["id"])[0] == world[other]
    cpu = post(server, pool=world["pool"], team=world["team"], exclude=[world["ib"]])
    assert placed_on(server, cpu["id"])[0] == world["plain"]


def test_a_qos_limits_each_users_running_jobs_and_names_slurms_reason(
    server: Server, world: dict[str, str]
) -> None:
    name = unique("qos")
    body = {"name": name, "priority": 10, "max_jobs_per_user": 1, "preemptable": False}
    with server.client() as c:
        made = ok(c.put(f"/qos/{name}", json=body))
        assert (made["max_jobs_per_user"], made["preemptable"], made["default"]) == (1, False, False)
        user = ok(c.post("/users", json={"name": unique("u"), "role": "user", "teams": [world["team"]]}), 201)
    with server.client(user["token"]) as mine:
        assert mine.put(f"/qos/{name}", json=body).status_code == 403
        assert name in {q["name"] for q in ok(mine.get("/qos"))["items"]}
    refused = post(server, 422, pool=world["pool"], team=world["team"], qos=unique("nope"))
    assert "invalid qos specification" in refused["detail"]
    first = post(server, pool=world["pool"], team=world["team"], gpus=1, qos=name)
    second = post(server, pool=world["pool"], team=world["team"], gpus=1, qos=name)
    assert (first["qos"], second["qos"]) == (name, name)
    wait_for(server, first["id"], "SCHEDULED")
    with server.client() as c:
        for _ in range(100):
            reason = ok(c.get(f"/jobs/{second['id']}"))["wait_reason"] or ""
            if reason:
                break
            time.sleep(0.05)
        assert reason.startswith("QOSMaxJobsPerUserLimit"), reason
        ok(c.post("/jobs/cancel", json={"ids": [first["id"], second["id"]]}))
        ok(c.put(f"/qos/{name}", json=body | {"default": True}))
        try:
            assert post(server, pool=world["pool"], team=world["team"], gpus=1, hold=True)["qos"] == name
        finally:  # the session's other tests submit without a QOS
            ok(c.put(f"/qos/{name}", json=body | {"default": False}))
        assert ok(c.delete(f"/qos/{name}"))["name"] == name


def test_licenses_an_operator_declares_are_held_by_running_jobs(
    server: Server, world: dict[str, str]
) -> None:
    name = unique("matlab")
    with server.client() as c:
        assert ok(c.put(f"/licenses/{name}", json={"count": 2})) == {"name": name, "count": 2, "used": 0}
    unknown = post(server, 422, pool=world["pool"], team=world["team"], licenses={unique("ansys"): 1})
    assert "invalid license specification" in unknown["detail"]
    assert "more than there are (2)" in post(server, 422, team=world["team"], licenses={name: 3})["detail"]
    first = post(server, pool=world["pool"], team=world["team"], gpus=1, licenses={name: 2})
    second = post(server, pool=world["pool"], team=world["team"], licenses={name: 1})  # 0 GPUs: held too
    assert first["licenses"] == {name: 2}
    wait_for(server, first["id"], "SCHEDULED")
    with server.client() as c:
        for _ in range(100):
            reason = ok(c.get(f"/jobs/{second['id']}"))["wait_reason"] or ""
            if reason:
                break
            time.sleep(0.05)
        assert reason.startswith("Licenses: needs 1 of license"), reason
        listed = {i["name"]: i["used"] for i in ok(c.get("/licenses"))["items"]}
        assert listed[name] == 2
        ok(c.post("/jobs/cancel", json={"ids": [first["id"]]}))
    wait_for(server, second["id"], "SCHEDULED")
    cancel(server, second["id"])
    with server.client() as c:
        ok(c.delete(f"/licenses/{name}"))
