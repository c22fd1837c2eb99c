"""Inference services through the API (no agents: replicas stay PENDING in a pool with
no nodes, or are placed on registered nodes): validation, who sees what, the replica
controller's first moves, tokens, the gateway feed, delete."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from server.conftest import Server, make_node, make_pool, make_team, make_user, ok, unique


def spec(name: str, pool: str, **kw: Any) -> dict[str, Any]:
    return {
        "name": name,
        "command": ["model-server"],
        "pool": pool,
        "replicas": 2,
        "protocol": "kserve-v2",
    } | kw


def until(c: httpx.Client, name: str, check: Any, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        out = ok(c.get(f"/services/{name}"))
        if check(out) or time.monotonic() > deadline:
            assert check(out), out
            return out  # type: ignore[no-any-return]
        time.sleep(0.05)


def sname() -> str:
    return unique("svc").lower().replace("_", "-").replace(".", "-")


BAD = [
    pytest.param({"command": None, "image": None}, "command", id="no-command-no-image"),
    pytest.param({"replicas": 65}, "replicas", id="too-many-replicas"),
    pytest.param({"replicas": 3, "max_replicas": 2}, "replicas", id="replicas-above-max"),
    pytest.param({"protocol": "grpc"}, "protocol", id="unknown-protocol"),
    pytest.param({"health_path": "health"}, "health_path", id="relative-health-path"),
    pytest.param({"readiness_timeout": -1}, "readiness_timeout", id="negative-timeout"),
    pytest.param({"env": {"1BAD": "x"}}, "env", id="bad-env-name"),
    pytest.param({"unknown": 1}, "unknown", id="unknown-field"),
    pytest.param({"gpus_per_replica": 0}, "gpus_per_replica", id="zero-gpus-in-a-gpu-pool"),
    pytest.param({"pool": "no-such-pool"}, "pool", id="no-such-pool"),
    pytest.param({"rate_limit": "fast"}, "rate_limit", id="bad-rate-limit"),
]


@pytest.mark.parametrize(("change", "field"), BAD)
def test_bad_specs_are_problems_and_change_nothing(
    server: Server, change: dict[str, Any], field: str
) -> None:
    pool = make_pool(server)
    make_team(server)
    name = sname()
    with server.client() as c:
        before = len(ok(c.get("/services")))
        r = c.put(f"/services/{name}", json=spec(name, pool) | change)
        assert r.status_code == 422, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert field in r.text
        assert len(ok(c.get("/services"))) == before
        assert c.get(f"/services/{name}").status_code == 404


def test_name_in_url_and_body_must_match_and_be_a_dns_label(server: Server) -> None:
    pool = make_pool(server)
    with server.client() as c:
        assert c.put("/services/abc", json=spec("xyz", pool)).status_code == 422
        assert c.put("/services/Bad_Name", json=spec("Bad_Name", pool)).status_code == 422


def test_deploy_creates_replicas_spread_over_nodes(server: Server) -> None:
    pool = make_pool(server)
    make_team(server)
    nodes = {make_node(server, pool=pool, gpus=4) for _ in range(3)}
    name = sname()
    with server.client() as c:
        out = ok(c.put(f"/services/{name}", json=spec(name, pool, replicas=3)))
        assert out["generation"] == 1 and out["replicas_desired"] == 3
        out = until(c, name, lambda o: len(o["replicas"]) == 3 and all(r["nodes"] for r in o["replicas"]))
        placed = [r["nodes"][0] for r in out["replicas"]]
        assert sorted(placed) == sorted(nodes)  # one replica per node: spread
        assert sorted(r["replica"] for r in out["replicas"]) == [0, 1, 2]
        job = ok(c.get(f"/jobs/{out['replicas'][0]['job_id']}"))
        assert job["time_limit_s"] is None
        # nothing is ready (no agent): the gateways get no endpoint
        feed = ok(c.get("/gateway/endpoints"))
        mine = [s for s in feed["services"] if s["name"] == name]
        assert mine == [{"name": name, "protocol": "kserve-v2", "tokens": [], "rate": None, "endpoints": []}]
        # a change of what replicas run is a new generation; a change of replicas is not
        out = ok(c.patch(f"/services/{name}", json={"replicas": 2}))
        assert out["generation"] == 1
        out = ok(c.patch(f"/services/{name}", json={"model_version": "2"}))
        assert out["generation"] == 2
        assert any(e["kind"] == "updated" for e in out["events"])
        assert c.patch(f"/services/{name}", json={"replicas": 99}).status_code == 422
        # delete: replicas stop, then the service is gone
        assert c.delete(f"/services/{name}").status_code == 202
        deadline = time.monotonic() + 10
        while c.get(f"/services/{name}").status_code != 404:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for r in out["replicas"]:
            assert ok(c.get(f"/jobs/{r['job_id']}"))["state"] == "CANCELLED"


def test_replicas_placed_in_later_passes_spread_from_scheduled_siblings(server: Server) -> None:
    """Scaled up one replica at a time (each placed by its own pass, its siblings still
    SCHEDULED: no agent starts them), the replicas still land on distinct nodes, and with
    more replicas than nodes the extra one shares a node only then."""
    pool = make_pool(server)
    make_team(server)
    nodes = {make_node(server, pool=pool, gpus=8) for _ in range(3)}
    name = sname()
    with server.client() as c:
        ok(c.put(f"/services/{name}", json=spec(name, pool, replicas=1)))
        for n in (1, 2, 3, 4):
            if n > 1:
                ok(c.patch(f"/services/{name}", json={"replicas": n}))
            out = until(
                c, name, lambda o, n=n: len(o["replicas"]) == n and all(r["nodes"] for r in o["replicas"])
            )
            assert all(r["state"] == "SCHEDULED" for r in out["replicas"]), out["replicas"]
            placed = [r["nodes"][0] for r in out["replicas"]]
            assert len(set(placed)) == min(n, 3), placed
        assert set(placed) == nodes
        assert c.delete(f"/services/{name}").status_code == 202


def test_rollback_runs_an_earlier_generations_replicas_as_a_new_generation(server: Server) -> None:
    pool = make_pool(server)
    team = make_team(server)
    name = sname()
    with server.client() as c:
        ok(c.put(f"/services/{name}", json=spec(name, pool, command=["serve", "v1"])))
        assert c.post(f"/services/{name}/rollback", json={}).status_code == 422  # nothing earlier
        ok(c.patch(f"/services/{name}", json={"command": ["serve", "v2"], "replicas": 3}))
        out = ok(c.patch(f"/services/{name}", json={"model_version": "7"}))
        assert out["generation"] == 3
        out = ok(c.post(f"/services/{name}/rollback", json={}))  # to generation 2
        assert out["generation"] == 4
        assert out["spec"]["command"] == ["serve", "v2"] and out["spec"]["model_version"] is None
        assert out["spec"]["replicas"] == 3  # the count stays as it is now
        out = ok(c.post(f"/services/{name}/rollback", json={"generation": 1}))
        assert out["generation"] == 5 and out["spec"]["command"] == ["serve", "v1"]
        kinds = [e["kind"] for e in out["events"]]
        last = max(i for i, k in enumerate(kinds) if k == "rollback")
        assert kinds.count("rollback") == 2 and "updated" in kinds[last + 1 :], (
            kinds
        )  # (the controller's in between)
        r = c.post(f"/services/{name}/rollback", json={"generation": 1})
        assert r.status_code == 409, r.text  # runs that already
        for bad in ({"generation": 5}, {"generation": 0}, {"generation": 2**40}, {"generation": "x"}):
            r = c.post(f"/services/{name}/rollback", json=bad)
            assert r.status_code == 422, (bad, r.text)
            assert r.headers["content-type"].startswith("application/problem+json")
        assert ok(c.get(f"/services/{name}"))["generation"] == 5  # refusals changed nothing
    other = make_user(server, role="user", team=team)
    with server.client(other) as c:
        assert c.post(f"/services/{name}/rollback", json={}).status_code == 404
    with server.client() as c:
        assert c.delete(f"/services/{name}").status_code == 202


def test_tokens_and_the_feed(server: Server) -> None:
    pool = make_pool(server)
    make_team(server)
    name = sname()
    with server.client() as c:
        ok(c.put(f"/services/{name}", json=spec(name, pool, replicas=0, rate_limit="600/1m")))
        feed = ok(c.get("/gateway/endpoints"))
        assert [s["rate"] for s in feed["services"] if s["name"] == name] == [{"burst": 600.0, "per_s": 10.0}]
        tok = ok(c.post(f"/services/{name}/tokens"), 201)
        assert tok["token"].startswith("gfs_")
        listed = ok(c.get(f"/services/{name}/tokens"))
        assert [t["token"] for t in listed] == [None]  # shown once
        import hashlib

        digest = hashlib.sha256(tok["token"].encode()).hexdigest()
        feed = ok(c.get("/gateway/endpoints"))
        assert [s["tokens"] for s in feed["services"] if s["name"] == name] == [[digest]]
        ok(c.delete(f"/services/{name}/tokens/{tok['id']}"))
        feed = ok(c.get("/gateway/endpoints"))
        assert [s["tokens"] for s in feed["services"] if s["name"] == name] == [[]]
        assert c.delete(f"/services/{name}/tokens/999999").status_code == 404


def test_another_users_service_is_invisible(server: Server) -> None:
    pool = make_pool(server)
    team = make_team(server)
    alice, bob = make_user(server, team=team), make_user(server, team=team)
    op = make_user(server, team=team, role="operator")
    name = sname()
    with server.client(alice) as a, server.client(bob) as b, server.client(op) as o:
        ok(a.put(f"/services/{name}", json=spec(name, pool, replicas=0)))
        assert [s["name"] for s in ok(a.get("/services"))] == [name]
        assert ok(b.get("/services")) == []
        for method, path, body in (
            ("GET", f"/services/{name}", None),
            ("PATCH", f"/services/{name}", {"replicas": 1}),
            ("DELETE", f"/services/{name}", None),
            ("POST", f"/services/{name}/tokens", None),
            ("GET", f"/services/{name}/tokens", None),
        ):
            r = b.request(method, path, json=body)
            assert r.status_code == 404, (method, path, r.text)
        # bob cannot take the name over either
        assert b.put(f"/services/{name}", json=spec(name, pool)).status_code == 409
        assert ok(a.get(f"/services/{name}"))["spec"]["replicas"] == 0
        # the feed is for gateways: operators and admins
        assert a.get("/gateway/endpoints").status_code == 403
        assert o.get(f"/services/{name}").status_code == 200
        ok(o.get("/gateway/endpoints"))


def test_a_service_at_higher_priority_preempts_training_and_the_plan_says_so(server: Server) -> None:
    pool = make_pool(server)
    team = make_team(server)
    make_node(server, pool=pool, gpus=2)
    name = sname()
    with server.client() as c:
        batch = [
            ok(c.post("/jobs", json={"command": ["train"], "gpus": 1, "pool": pool, "team": team}), 201)["id"]
            for _ in range(2)
        ]
        deadline = time.monotonic() + 10
        while {ok(c.get(f"/jobs/{j}"))["state"] for j in batch} != {"SCHEDULED"}:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        ok(c.put(f"/services/{name}", json=spec(name, pool, replicas=1, priority=500, team=team)))
        out = until(c, name, lambda o: o["replicas"] and o["replicas"][0]["nodes"])
        replica = out["replicas"][0]["job_id"]
        events = [e for j in batch for e in ok(c.get(f"/jobs/{j}"))["events"] if e["to_state"] == "PREEMPTED"]
        assert len(events) == 1, events
        assert f"preempted for job {replica}" in events[0]["reason"]
        assert f"a replica of service {name}" in events[0]["reason"]
        ok(c.delete(f"/services/{name}"), 202)


def test_gateway_reports_feed_the_services_traffic(server: Server) -> None:
    pool = make_pool(server)
    team = make_team(server)
    user = make_user(server, team=team)
    name = sname()
    report = {
        "gateway": "gw-test",
        "services": {
            name: {
                "codes": {"200": 90, "503": 10},
                "inflight": 2,
                "latency": {"le": [0.01, 0.1, 1e9], "counts": [50, 100, 100], "sum": 2.5, "count": 100},
            }
        },
    }
    with server.client() as c, server.client(user) as u:
        ok(c.put(f"/services/{name}", json=spec(name, pool, replicas=0)))
        assert u.post("/gateway/report", json=report).status_code == 403  # gateways only
        bad = c.post("/gateway/report", json={"gateway": "gw", "services": {name: {"codes": {"999": 1}}}})
        assert bad.status_code == 204  # a bad entry is skipped and counted, not the report refused
        no_id = c.post("/gateway/report", json={"services": {}})
        assert no_id.status_code == 422 and no_id.headers["content-type"].startswith(
            "application/problem+json"
        )
        first = {**report, "services": {name: {"codes": {}, "inflight": 0}}}
        assert c.post("/gateway/report", json=first).status_code == 204
        time.sleep(0.05)
        assert c.post("/gateway/report", json=report).status_code == 204
        traffic = ok(c.get(f"/services/{name}"))["traffic"]
        assert traffic["gateways"] == 1 and traffic["error_rate"] == 0.1 and traffic["inflight"] == 2
        assert traffic["qps"] > 0 and 10.0 <= traffic["p99_ms"] <= 100.0


def test_replicas_need_the_cuda_the_service_declares(server: Server) -> None:
    """``cuda`` on a service: its replicas run only where the driver supports it (as ``submit
    --cuda``), wait with the reason where none does, and a change of it rolls them."""
    pool = make_pool(server)
    make_team(server)
    node = make_node(server, pool=pool, gpus=2)
    with server.client() as c:
        live = {"jobs": [], "cuda_version": "12.4", "driver_version": "550.54.15"}
        ok(c.post(f"/nodes/{node}/sync", json=live))
        bad = c.put(f"/services/{sname()}", json=spec("x", pool, cuda="abc"))
        assert bad.status_code == 422, bad.text
        name = sname()
        out = ok(c.put(f"/services/{name}", json=spec(name, pool, replicas=1, cuda="99.0.1")))
        want = f"BadConstraints: needs CUDA 99.0; the newest driver in pool {pool} supports 12.4"

        def waits(o: dict[str, Any]) -> bool:
            if not o["replicas"]:
                return False
            job = ok(c.get(f"/jobs/{o['replicas'][0]['job_id']}"))
            return job["state"] == "PENDING" and job["cuda"] == "99.0" and job["wait_reason"] == want

        until(c, name, waits, timeout=15)
        out = ok(c.patch(f"/services/{name}", json={"cuda": "12.4"}))
        assert out["generation"] == 2  # what replicas run changed: a new generation
        out = until(c, name, lambda o: any(r["nodes"] == [node] for r in o["replicas"]), timeout=15)
        placed = next(r for r in out["replicas"] if r["nodes"] == [node])
        assert ok(c.get(f"/jobs/{placed['job_id']}"))["cuda"] == "12.4"
        assert c.delete(f"/services/{name}").status_code == 202
