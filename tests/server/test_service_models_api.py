"""Service model wishes through the API and the sync protocol, on SQLite and PostgreSQL
(issue 30; the processes are in ``tests/services/test_service_models.py``): a wish goes
down in the replica's ``ServiceProbe.models``, what a node reports comes back in
``service show``, a report for an old wish counts as not reported, a forgotten wish is
gone from both, and a deleted service's name starts without the old wishes."""

from __future__ import annotations

from typing import Any

from server.conftest import Server, make_team, make_user, ok, unique
from server.playnode import attempt_of, eventually, register, sync, wait_for


def _service_job(srv: Server, name: str) -> dict[str, Any]:
    def placed() -> dict[str, Any] | None:
        with srv.client() as c:
            reps = ok(c.get(f"/services/{name}"))["replicas"]
        return reps[0] if reps and reps[0]["state"] == "SCHEDULED" else None

    rep = eventually(placed, timeout=60)  # a busy machine
    assert rep, f"the replica of {name} was not placed"
    return wait_for(srv, rep["job_id"], "SCHEDULED")  # type: ignore[no-any-return]


def _desired(srv: Server, node: str, token: str, job_id: int, seen: list[dict[str, Any]]) -> dict[str, Any]:
    reply = sync(srv, node, {"jobs": seen}, token=token)
    return next(d for d in reply["jobs"] if d["job_id"] == job_id)  # type: ignore[no-any-return]


def test_a_wish_goes_down_and_the_replicas_state_comes_back(server: Server) -> None:
    team = make_team(server)
    pool = unique("mpool")
    with server.client() as c:
        ok(c.post("/pools", json={"name": pool}), 201)
    node, token = register(server, pool=pool, gpus=1)
    name = unique("wish").lower()
    spec = {
        "name": name,
        "team": team,
        "pool": pool,
        "command": ["serve"],
        "replicas": 1,
        "gpus_per_replica": 1,
    }
    with server.client() as c:
        ok(c.put(f"/services/{name}", json=spec))
    job = _service_job(server, name)
    attempt = attempt_of(job)
    running = {"job_id": job["id"], "attempt": attempt, "state": "running"}
    ready = running | {"ready": True, "endpoint": "http://127.0.0.1:9"}
    assert _desired(server, node, token, job["id"], [running])["service"]["models"] == {}

    with server.client() as c:
        got = ok(c.put(f"/services/{name}/models/mlp", json={"state": "unloaded"}))
        assert (got["wanted"], got["replicas"], got["per_replica"]) == ("unloaded", 0, [])
    assert _desired(server, node, token, job["id"], [ready])["service"]["models"] == {"mlp": False}
    with server.client() as c:  # ready, nothing reported about the model yet
        (m,) = ok(c.get(f"/services/{name}"))["models"]
        assert (m["replicas"], m["converged"], m["per_replica"][0]["state"]) == (1, 0, "PENDING")

    report = {"name": "mlp", "state": "UNAVAILABLE", "reason": "unloaded", "wanted": "unloaded"}
    _desired(server, node, token, job["id"], [ready | {"models": [report]}])
    with server.client() as c:
        (m,) = ok(c.get(f"/services/{name}/models"))
        assert (m["replicas"], m["converged"], m["failed"]) == (1, 1, 0)
        assert m["per_replica"] == [
            {"job_id": job["id"], "replica": 0, "state": "UNAVAILABLE", "reason": "unloaded"}
        ]
        # a changed wish: the report of the old one is not counted for the new one
        ok(c.put(f"/services/{name}/models/mlp", json={"state": "loaded"}))
        (m,) = ok(c.get(f"/services/{name}/models"))
        assert (m["wanted"], m["converged"], m["per_replica"][0]["state"]) == ("loaded", 0, "PENDING")
    failed = {"name": "mlp", "state": "FAILED", "reason": "load: HTTP 404: no such model", "wanted": "loaded"}
    assert _desired(server, node, token, job["id"], [ready | {"models": [failed]}])["service"]["models"] == {
        "mlp": True
    }
    with server.client() as c:
        out = ok(c.get(f"/services/{name}"))
        (m,) = out["models"]
        assert (m["converged"], m["failed"], m["per_replica"][0]["reason"]) == (0, 1, failed["reason"])
        kinds = [e["kind"] for e in out["events"]]
        assert kinds.count("model-unload") == 1 and kinds.count("model-load") == 1, kinds
        assert [e["reason"] for e in out["events"] if e["kind"] == "deployed"] == ["1 replica"]

        # another user: nothing of it, not even that the wish exists
        other = make_user(server, team=team)
        with server.client(other) as o:
            assert o.get(f"/services/{name}/models").status_code == 404
            assert o.put(f"/services/{name}/models/x", json={"state": "loaded"}).status_code == 404
            assert o.delete(f"/services/{name}/models/mlp").status_code == 404

        # forget: gone from show and from what the node is sent
        assert ok(c.delete(f"/services/{name}/models/mlp"))["wanted"] == "loaded"
        assert c.delete(f"/services/{name}/models/mlp").status_code == 404
        assert ok(c.get(f"/services/{name}"))["models"] == []
    assert _desired(server, node, token, job["id"], [ready])["service"]["models"] == {}

    # a deleted service's name starts over without its wishes
    with server.client() as c:
        ok(c.put(f"/services/{name}/models/again", json={"state": "loaded"}))
        assert c.delete(f"/services/{name}").status_code == 202
        r = c.put(f"/services/{name}/models/mlp", json={"state": "loaded"})
        assert r.status_code == 409, r.text  # while it is being deleted (its replica still held)
    done = {"job_id": job["id"], "attempt": attempt, "state": "exited", "exit_code": 0}

    def gone() -> bool:
        sync(server, node, {"jobs": [done]}, token=token)
        with server.client() as c:
            return c.get(f"/services/{name}").status_code == 404

    assert eventually(gone, timeout=60)  # the drain (5 s), then the stop
    with server.client() as c:
        ok(c.put(f"/services/{name}", json=spec))
        assert ok(c.get(f"/services/{name}/models")) == []
