"""Deleting pools: only an unused one goes, and never ``default`` — a node that registers
by its first sync joins it, so without it every such sync failed with a 500 (found by
the fuzz pass: ``DELETE /v1/pools/default`` then a sync from a new node)."""

from __future__ import annotations

from server.conftest import Server, make_node, make_pool, ok, unique


def test_the_default_pool_cannot_be_deleted_and_new_nodes_still_join_it(server: Server) -> None:
    with server.client() as c:
        r = c.delete("/pools/default")
        assert r.status_code == 409, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert "default" in r.json()["detail"]
        assert any(p["name"] == "default" for p in ok(c.get("/pools", params={"limit": 1000}))["items"])
        node = unique("newnode")
        body = {"gpus": [{"index": 0, "model": "H100"}], "leaf": "l0", "rack": "r0"}
        assert c.post(f"/nodes/{node}/sync", json=body).status_code == 200
        assert ok(c.get(f"/nodes/{node}"))["pool"] == "default"


def test_only_an_unused_pool_can_be_deleted(server: Server) -> None:
    used = make_pool(server)
    make_node(server, pool=used, gpus=1)
    empty = make_pool(server)
    with server.client() as c:
        r = c.delete(f"/pools/{used}")
        assert r.status_code == 409 and "nodes" in r.json()["detail"]
        assert ok(c.delete(f"/pools/{empty}"))["name"] == empty
        assert c.delete(f"/pools/{empty}").status_code == 404
