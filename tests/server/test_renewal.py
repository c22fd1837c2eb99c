"""An idle node's lease renewal on a running server (``services/renew.py``, issue 35):
many renewals write nothing to the node's row but its ``last_seen`` (in bulk, at most
once here), keep it Ready and its telemetry fresh; a refused lease is gone; a fleet
change drops every lease; bad input is a 4xx."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import text

from server.conftest import Server, make_team, make_user, ok, unique


def _sync(c: httpx.Client, node: str) -> dict[str, Any]:
    body = {
        "gpus": [{"index": i, "uuid": f"GPU-{node}-{i}", "model": "H100"} for i in range(2)],
        "telemetry": [{"index": i, "temperature_c": 35.0, "power_w": 70.0} for i in range(2)],
        "jobs": [],
        "logs": [],
    }
    return ok(c.post(f"/nodes/{node}/sync", json=body))  # type: ignore[no-any-return]


def _row(server: Server, node: str) -> dict[str, Any]:
    with server.engine.connect() as c:
        return dict(c.execute(text("SELECT * FROM nodes WHERE name = :n"), {"n": node}).mappings().one())


def test_renewals_write_nothing_but_keep_the_node_ready(server: Server) -> None:
    node = unique("idle")
    with server.client() as c:
        lease = _sync(c, node)["lease"]
        assert lease
        before = _row(server, node)
        at = ok(c.get(f"/nodes/{node}"))["telemetry_at"]
        seen = set()
        for _ in range(20):
            answer = ok(c.post(f"/nodes/{node}/renew", json={"lease": lease}))
            assert answer == {"node": node, "renewed": True}
            seen.add(_row(server, node)["last_seen"])
        out = ok(c.get(f"/nodes/{node}"))
        metrics = c.get(server.url + "/metrics").text
    after = _row(server, node)
    assert {k: v for k, v in after.items() if k != "last_seen"} == {
        k: v for k, v in before.items() if k != "last_seen"
    }
    assert len(seen - {before["last_seen"]}) <= 1  # one bulk flush at most (a sixth of the timeout)
    assert out["state"] == "Ready"
    assert out["telemetry_at"] > at  # the held readings, as fresh as the renewal
    assert [g["telemetry"]["power_w"] for g in out["gpus"]] == [70.0, 70.0]
    taken = [
        line.split()[1] for line in metrics.splitlines() if line.startswith("gpufleet_node_renewals_total ")
    ]
    assert float(taken[0]) >= 20


def test_a_refused_lease_is_gone_and_a_fleet_change_drops_every_lease(server: Server) -> None:
    a, b = unique("idle"), unique("idle")
    with server.client() as c:
        lease_a, lease_b = _sync(c, a)["lease"], _sync(c, b)["lease"]
        assert not ok(c.post(f"/nodes/{a}/renew", json={"lease": lease_b}))["renewed"]  # b's, not a's
        assert not ok(c.post(f"/nodes/{a}/renew", json={"lease": lease_a}))["renewed"]  # gone: sync in full
        assert ok(c.post(f"/nodes/{b}/renew", json={"lease": lease_b}))["renewed"]
        ok(c.delete(f"/nodes/{a}"))
        assert not ok(c.post(f"/nodes/{b}/renew", json={"lease": lease_b}))["renewed"]


def test_bad_renewals_are_4xx(server: Server) -> None:
    node = unique("idle")
    user = make_user(server, team=make_team(server))
    with server.client() as c:
        lease = _sync(c, node)["lease"]
        for body in ({"lease": ""}, {"lease": "x" * 65}, {}, {"lease": lease, "extra": 1}, {"lease": 7}):
            resp = c.post(f"/nodes/{node}/renew", json=body)
            assert resp.status_code == 422, body
            assert resp.headers["content-type"].startswith("application/problem+json")
        assert c.post(f"/nodes/{'x' * 64}/renew", json={"lease": lease}).status_code == 422
    with server.client(user) as c:
        assert c.post(f"/nodes/{node}/renew", json={"lease": lease}).status_code == 403
    with server.client(None) as c:
        assert c.post(f"/nodes/{node}/renew", json={"lease": lease}).status_code == 401
    with server.client() as c:  # none of it cost the lease
        assert ok(c.post(f"/nodes/{node}/renew", json={"lease": lease}))["renewed"]
