"""Node lifecycle and GPU health end to end: a real server (short timings), agents with
simulated GPUs whose faults are injected through the probe."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from failover.conftest import (
    NODE_TIMEOUT_S,
    REQUEUE_AFTER_S,
    Node,
    job,
    make_pool,
    node_out,
    running_on,
    submit,
    transitions,
    until,
)
from gpufleet.agent import SimulatedProbe
from server.conftest import Server, make_user, ok

FAULTS: list[tuple[str, Callable[[SimulatedProbe, int], None], str]] = [
    ("overheat", lambda p, g: p.overheat(g), "temperature"),
    ("xid-79-fell-off-bus", lambda p, g: p.xid(g, 79), "xid"),
    ("xid-48-dbe", lambda p, g: p.xid(g, 48), "xid"),
    ("xid-94-contained-ecc", lambda p, g: p.xid(g, 94), "xid"),
    ("ecc-double-bit", lambda p, g: p.ecc_double_bit(g), "ecc"),
    ("gpu-lost", lambda p, g: p.lose(g), "lost"),
    ("retired-pages", lambda p, g: p.retire_pages(g, 64), "retired_pages"),
]


@pytest.mark.parametrize(("inject", "rule"), [(f, r) for _, f, r in FAULTS], ids=[i for i, _, _ in FAULTS])
def test_gpu_fault_cordons_that_gpu_and_requeues_its_job(
    fast_server: Server,
    team: str,
    nodes: Callable[..., Node],
    inject: Callable[[SimulatedProbe, int], None],
    rule: str,
) -> None:
    pool = make_pool(fast_server)
    node = nodes(pool=pool, gpus=2)
    jid = submit(fast_server, team=team, pool=pool)
    where = until(lambda: running_on(fast_server, jid), what="running")
    bad = where[1][0]
    t0 = time.monotonic()
    inject(node.probe, bad)
    moved = until(
        lambda: (r := running_on(fast_server, jid)) and r[1] != [bad] and r, what="running elsewhere"
    )
    assert moved == (node.name, [1 - bad])
    assert time.monotonic() - t0 < 10
    n = node_out(fast_server, node.name)
    assert not n["cordoned"], "only the GPU is cordoned, not the node"
    assert [g["index"] for g in n["gpus"] if g["cordoned"]] == [bad]
    assert ("RUNNING", "REQUEUED") in transitions(fast_server, jid)
    assert job(fast_server, jid)["attempts"] == 1
    with fast_server.client() as c:
        evs = ok(c.get("/fleet/events", params={"node": node.name, "alerts": True}))
    assert [(e["kind"], e["gpu_index"], e["job_id"]) for e in evs] == [("gpu_cordoned", bad, jid)]
    assert evs[0]["reason"].startswith(rule)


def test_harmless_xid_changes_nothing(fast_server: Server, team: str, nodes: Callable[..., Node]) -> None:
    pool = make_pool(fast_server)
    node = nodes(pool=pool, gpus=1)
    jid = submit(fast_server, team=team, pool=pool)
    until(lambda: running_on(fast_server, jid))
    node.probe.xid(0, 13)  # a graphics engine exception: the application's fault
    time.sleep(1.0)
    assert running_on(fast_server, jid) == (node.name, [0])
    assert not node_out(fast_server, node.name)["gpus"][0]["cordoned"]


def test_overheat_recovers_after_normal_readings(
    fast_server: Server, team: str, nodes: Callable[..., Node]
) -> None:
    pool = make_pool(fast_server)
    node = nodes(pool=pool, gpus=1)
    node.probe.overheat(0)
    until(lambda: node_out(fast_server, node.name)["gpus"][0]["cordoned"], what="cordoned")
    node.probe.clear(0)
    until(lambda: not node_out(fast_server, node.name)["gpus"][0]["cordoned"], what="recovered")
    with fast_server.client() as c:
        kinds = [e["kind"] for e in ok(c.get("/fleet/events", params={"node": node.name}))]
    assert kinds == ["gpu_cordoned", "gpu_recovered"]


def test_short_pause_requeues_nothing(fast_server: Server, team: str, nodes: Callable[..., Node]) -> None:
    """A pause longer than the node timeout but shorter than timeout + requeue-after
    (the 20 s SIGSTOP of the issue, scaled down)."""
    pool = make_pool(fast_server)
    node = nodes(pool=pool)
    jid = submit(fast_server, team=team, pool=pool)
    until(lambda: running_on(fast_server, jid))
    node.pause()
    time.sleep(NODE_TIMEOUT_S + REQUEUE_AFTER_S * 0.5)
    node.resume()
    time.sleep(0.5)
    assert job(fast_server, jid)["state"] == "RUNNING"
    assert ("RUNNING", "REQUEUED") not in transitions(fast_server, jid)
    assert node.agent.stats.stopped == 0


def test_lost_node_jobs_run_elsewhere_and_the_returning_node_stops_them(
    fast_server: Server, team: str, nodes: Callable[..., Node]
) -> None:
    pool = make_pool(fast_server)
    a = nodes(pool=pool, gpus=1)
    jid = submit(fast_server, team=team, pool=pool)
    until(lambda: running_on(fast_server, jid) == (a.name, [0]))
    keep = submit(fast_server, team=team, pool=pool, requeue=False)  # waits: A is full
    b = nodes(pool=pool, gpus=1)
    until(lambda: running_on(fast_server, keep) == (b.name, [0]))
    c = nodes(pool=pool, gpus=1)
    a.pause()  # A's simulated job keeps "running" on A
    until(lambda: node_out(fast_server, a.name)["lost"], timeout=10, what="lost")
    assert until(lambda: running_on(fast_server, jid), what="running again") == (c.name, [0])
    assert a.agent.running(), "A does not know yet"
    a.resume()
    until(lambda: not a.agent.running(), what="A stopped the requeued attempt")
    assert a.agent.stats.stopped == 1
    until(lambda: not node_out(fast_server, a.name)["lost"], what="A back")
    assert running_on(fast_server, jid) == (c.name, [0])
    assert transitions(fast_server, jid).count(("RUNNING", "REQUEUED")) == 1


def test_no_requeue_job_fails_when_its_node_is_lost(
    fast_server: Server, team: str, nodes: Callable[..., Node]
) -> None:
    pool = make_pool(fast_server)
    a = nodes(pool=pool, gpus=1)
    jid = submit(fast_server, team=team, pool=pool, requeue=False)
    until(lambda: running_on(fast_server, jid))
    a.pause()
    done = until(lambda: (j := job(fast_server, jid))["state"] == "FAILED" and j, what="failed")
    assert "not requeued (--no-requeue)" in done["events"][-1]["reason"]


def test_max_attempts_then_failed(fast_server: Server, team: str, nodes: Callable[..., Node]) -> None:
    pool = make_pool(fast_server)
    node = nodes(pool=pool, gpus=2)
    jid = submit(fast_server, team=team, pool=pool, max_attempts=2, requeue_backoff=0)
    until(lambda: running_on(fast_server, jid))
    node.probe.xid(running_on(fast_server, jid)[1][0], 79)
    second = until(  # one read of the job: its second attempt, running
        lambda: (j := job(fast_server, jid))["attempts"] == 1 and j["state"] == "RUNNING" and j["allocation"]
    )
    node.probe.xid(second[0]["gpus"][0], 79)
    assert until(lambda: job(fast_server, jid)["state"] == "FAILED", what="failed")
    assert "2 attempts used" in job(fast_server, jid)["events"][-1]["reason"]


def test_maintenance_is_for_operators(fast_server: Server, team: str, nodes: Callable[..., Node]) -> None:
    pool = make_pool(fast_server)
    node = nodes(pool=pool, gpus=1)
    user = make_user(fast_server, team=team)
    with fast_server.client(user) as c:
        for path, body in [("cordon", {}), ("uncordon", {}), ("drain", {"requeue": True})]:
            assert c.post(f"/nodes/{node.name}/{path}", json=body).status_code == 403
        assert c.post("/rollouts", json={"all": True}).status_code == 403
        assert c.get("/fleet/events").status_code == 403


def test_drain_requeue_and_uncordon(fast_server: Server, team: str, nodes: Callable[..., Node]) -> None:
    pool = make_pool(fast_server)
    a, b = nodes(pool=pool, gpus=1), nodes(pool=pool, gpus=1)
    jid = submit(fast_server, team=team, pool=pool)
    first = until(lambda: running_on(fast_server, jid))
    other = b if first[0] == a.name else a
    with fast_server.client() as c:
        n = ok(c.post(f"/nodes/{first[0]}/drain", json={"requeue": True, "reason": "driver"}))
        assert n["cordoned"] and n["draining"]
        until(lambda: running_on(fast_server, jid) == (other.name, [0]), what="running on the other node")
        n = ok(c.post(f"/nodes/{first[0]}/uncordon"))
        assert not n["cordoned"] and not n["draining"]


def test_gpu_cordon_by_operator(fast_server: Server, team: str, nodes: Callable[..., Node]) -> None:
    pool = make_pool(fast_server)
    node = nodes(pool=pool, gpus=2)
    with fast_server.client() as c:
        ok(c.post(f"/nodes/{node.name}/cordon", json={"gpu": 0, "reason": "fan"}))
        jid = submit(fast_server, team=team, pool=pool)
        assert until(lambda: running_on(fast_server, jid)) == (node.name, [1])
        out = ok(c.post(f"/nodes/{node.name}/uncordon", json={"gpu": 0}))
        assert not out["gpus"][0]["cordoned"]
        assert c.post(f"/nodes/{node.name}/cordon", json={"gpu": 7}).status_code == 404


def test_rolling_drain_keeps_max_unavailable(
    fast_server: Server, team: str, nodes: Callable[..., Node]
) -> None:
    pool = make_pool(fast_server)
    fleet = [nodes(pool=pool, gpus=1) for _ in range(3)]
    with fast_server.client() as c:
        ro = ok(
            c.post("/rollouts", json={"all": True, "pool": pool, "max_unavailable": 1, "requeue": True}), 201
        )
        assert c.post("/rollouts", json={"all": True, "pool": pool}).status_code == 409
        for n in fleet:
            r = until(
                lambda n=n: (x := ok(c.get(f"/rollouts/{ro['id']}")))["counts"]["drained"] == 1 and x,
                what=f"{n.name} drained",
            )
            assert r["counts"]["draining"] + r["counts"]["drained"] == 1
            drained = next(m["node"] for m in r["nodes"] if m["state"] == "drained")
            ok(c.post(f"/nodes/{drained}/uncordon"))
        done = until(lambda: (x := ok(c.get(f"/rollouts/{ro['id']}")))["state"] == "done" and x)
        assert done["counts"]["done"] == 3
