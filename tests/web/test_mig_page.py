"""MIG and GPU shares on the fleet page, against a server of its own (SQLite) and its
agents played through the sync endpoint: a node whose GPU 1 is cut in three MIG
instances, GPU 2 in MIG mode with a new layout asked for (7g.80gb) and GPU 3 asked back
whole; a node whose GPU 1 is shared, 75 % of it held by two share jobs; and a plain
node. The snapshot the page polls carries the instances and the pending layouts of those
GPUs only, and the held % of the shared one; in Chromium GPU 1's tile shows the cuts and
its title names the instances, the node panel shows the MIG pills next to the cordon,
and the shared GPU's tile and pill say "shared 75 %". Saves /tmp/mig_page.png."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from server.conftest import ADMIN_TOKEN, Server, make_pool, make_team, ok, start_server, stop_server
from server.playnode import join_token, placed, submit, sync
from web.conftest import sign_in

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (Python package) not installed")

MODEL = "NVIDIA H100 80GB HBM3"
NODE, PLAIN, SHARE = "mig-node-001", "plain-node-002", "share-node-003"
# GPU index -> its instances as the agent reports them: (profile, first memory slice, slices)
LAYOUTS: dict[int, list[tuple[str, int, int]]] = {
    1: [("3g.40gb", 4, 4), ("2g.20gb", 0, 2), ("2g.20gb", 2, 2)],  # reported out of order
    2: [("3g.40gb", 0, 4), ("3g.40gb", 4, 4)],
    3: [("7g.80gb", 0, 8)],
}


@dataclass(frozen=True)
class Fleet:
    server: Server
    cordon: dict[int, str]
    """GPU index -> the cordon reason the server gave it (the pending layouts)"""


def _gpus(node: str, *, mig: bool) -> list[dict[str, Any]]:
    out = []
    for i in range(4):
        g: dict[str, Any] = {"index": i, "model": MODEL, "uuid": f"GPU-{node}-{i}", "mig_enabled": False}
        if mig and i in LAYOUTS:
            g |= {
                "mig_enabled": True,
                "mig_instances": [
                    {
                        "uuid": f"MIG-{node}-{i}-{k}",
                        "profile": p,
                        "gpu_instance_id": k,
                        "compute_instance_id": 0,
                        "start": start,
                        "size": size,
                        "memory_mb": size * 10_240,
                    }
                    for k, (p, start, size) in enumerate(LAYOUTS[i])
                ],
            }
        out.append(g)
    return out


def _telemetry(util: float) -> list[dict[str, Any]]:
    return [
        {"index": i, "utilization_pct": util * i, "memory_used_mb": 4_000 * i, "temperature_c": 40.0 + i,
         "power_w": 100.0, "ecc_dbe": 0}
        for i in range(4)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    srv = start_server(f"sqlite:///{tmp_path_factory.mktemp('mig') / 'gpufleet.db'}")
    try:
        pool = make_pool(srv)
        for name, mig in ((NODE, True), (PLAIN, False), (SHARE, False)):
            with srv.client() as c:
                ok(c.put(f"/nodes/{name}", json={"pool": pool, "gpus": _gpus(name, mig=False)}))
            body = {"gpus": _gpus(name, mig=mig), "telemetry": _telemetry(25.0), "jobs": []}
            sync(srv, name, body, token=join_token(srv, name))
        with srv.client() as c:
            ok(c.put(f"/nodes/{SHARE}/gpus/1/share", json={"shared": True}))
        team = make_team(srv)
        jobs = [submit(srv, gpu_fraction=part, pool=pool, team=team) for part in (0.5, 0.25)]
        with srv.client() as c:
            ok(c.put(f"/nodes/{NODE}/gpus/2/mig", json={"layout": ["7g.80gb"]}))
            ok(c.put(f"/nodes/{NODE}/gpus/3/mig", json={"whole": True}))
            gpus = ok(c.get(f"/nodes/{NODE}"))["gpus"]
        assert [g["cordoned"] for g in gpus] == [False, False, True, True], gpus
        for job in jobs:
            placed(srv, job["id"])
        yield Fleet(server=srv, cordon={i: gpus[i]["cordon_reason"] for i in (2, 3)})
    finally:
        stop_server(srv)


def _snapshot(srv: Server) -> dict[str, dict[str, Any]]:
    """The page's snapshot by node, once it shows the pending layouts and the shares
    (cached a second)."""
    deadline = time.monotonic() + 10
    with srv.client() as c:
        while True:
            by = {n["name"]: n for n in ok(c.get("/fleet/snapshot"))["nodes"]}
            shown = by[NODE].get("mig_pending") and by[SHARE]["gpus"][1][7:] == [75]
            if shown or time.monotonic() > deadline:
                return by


def test_the_snapshot_carries_mig_of_the_gpus_that_have_it(fleet: Fleet) -> None:
    by = _snapshot(fleet.server)
    node, plain = by[NODE], by[PLAIN]
    assert node["mig"] == {
        "1": [["2g.20gb", 0, 2], ["2g.20gb", 2, 2], ["3g.40gb", 4, 4]],  # by first memory slice
        "2": [["3g.40gb", 0, 4], ["3g.40gb", 4, 4]],
        "3": [["7g.80gb", 0, 8]],
    }
    assert node["mig_pending"] == {"2": "7g.80gb", "3": "whole"}
    assert node["cordoned_gpus"] == {"2": fleet.cordon[2], "3": fleet.cordon[3]}
    assert "mig" not in plain and "mig_pending" not in plain  # nothing for a node without MIG
    assert [g[0] for g in plain["gpus"]] == [0, 1, 2, 3]
    # a shared GPU: flag 16 and an eighth number, the % its jobs hold; no other GPU has either
    rows = [g for n in by.values() for g in n["gpus"]]
    shared = by[SHARE]["gpus"][1]
    assert shared[5] & (16 | 8) == 16 | 8 and shared[7] == 75, shared
    assert [len(g) for g in rows if g is not shared] == [7] * (len(rows) - 1)
    assert not any(g[5] & 16 for g in rows if g is not shared)


def test_tiles_and_node_panel_show_the_slices(page: Any, fleet: Fleet) -> None:
    _snapshot(fleet.server)
    sign_in(page, fleet.server.url, ADMIN_TOKEN)
    tiles = page.locator(f"#heatmap .node[data-node='{NODE}'] .tile")
    sync_api.expect(tiles).to_have_count(4)
    one, two, three = tiles.nth(1), tiles.nth(2), tiles.nth(3)
    sync_api.expect(one).to_have_class("tile mig")
    # cuts at memory slices 2 and 4 of 8, a segment per instance
    assert [c.get_attribute("style") for c in one.locator(".mig-cut").all()] == ["left:25%", "left:50%"]
    segs = [s.get_attribute("style") for s in one.locator(".mig-seg").all()]
    assert segs == ["left:0%;width:25%", "left:25%;width:25%", "left:50%;width:50%"]
    assert (one.get_attribute("title") or "").startswith(f"{NODE} GPU 1: MIG 2g.20gb, 2g.20gb, 3g.40gb · ")
    sync_api.expect(two.locator(".mig-cut")).to_have_count(1)
    sync_api.expect(two).to_have_class("tile cord mig mig-pending")
    title = two.get_attribute("title") or ""
    assert f"{NODE} GPU 2: MIG 3g.40gb, 3g.40gb · MIG layout 7g.80gb pending · " in title, title
    assert "MIG layout whole GPU pending" in (three.get_attribute("title") or "")
    assert three.locator(".mig-cut").count() == 0 and three.locator(".mig-seg").count() == 1
    # a GPU without MIG, and the plain node: no markers, the title as before
    zero = tiles.nth(0)
    assert zero.locator("i").count() == 0 and zero.get_attribute("class") == "tile"
    assert "MIG" not in (zero.get_attribute("title") or "")
    plain = page.locator(f"#heatmap .node[data-node='{PLAIN}']")
    assert plain.locator(".tile i").count() == 0
    assert "MIG" not in (plain.get_attribute("aria-label") or "")
    label = page.locator(f"#heatmap .node[data-node='{NODE}']").get_attribute("aria-label") or ""
    assert "GPU 1: MIG 2g.20gb, 2g.20gb, 3g.40gb" in label and "GPU 2: MIG 3g.40gb, 3g.40gb" in label

    page.locator(f"#heatmap .node[data-node='{NODE}']").click()
    sync_api.expect(page.locator("#node-title")).to_have_text(NODE)
    rows = page.locator("#node-body table").first.locator("tbody tr")
    sync_api.expect(rows).to_have_count(4)
    sync_api.expect(rows.nth(1).locator(".pill.mig")).to_have_text("MIG 2g.20gb·2g.20gb·3g.40gb")
    sync_api.expect(rows.nth(1).locator(".pill.cordoned")).to_have_count(0)
    pills = rows.nth(2).locator(".pill")
    sync_api.expect(pills).to_have_text(["MIG 3g.40gb·3g.40gb", "MIG → 7g.80gb pending", "cordoned"])
    why = f"GPU cordoned: {fleet.cordon[2]}"
    sync_api.expect(pills.nth(1)).to_have_attribute("title", f"asked for, not yet applied; {why}")
    sync_api.expect(pills.nth(2)).to_have_attribute("title", why)
    sync_api.expect(rows.nth(3).locator(".pill.mig-pending")).to_have_text("MIG → whole GPU pending")
    assert rows.nth(0).locator(".pill").count() == 0
    sync_api.expect(page.locator("#node-body .attn")).to_contain_text(f"GPU 2 cordoned: {fleet.cordon[2]}")

    # the shared GPU: a foot bar filled to 75 %, the title and the node's label say so
    share_node = page.locator(f"#heatmap .node[data-node='{SHARE}']")
    shared = share_node.locator(".tile").nth(1)
    sync_api.expect(shared).to_have_class("tile shared")
    assert shared.locator(".share-fill").get_attribute("style") == "width:75%"
    assert (shared.get_attribute("title") or "").startswith(f"{SHARE} GPU 1: shared, 75 % held · ")
    assert "GPU 1: shared, 75 % held" in (share_node.get_attribute("aria-label") or "")
    assert share_node.locator(".tile").nth(0).locator("i").count() == 0
    share_node.click()
    sync_api.expect(page.locator("#node-title")).to_have_text(SHARE)
    rows = page.locator("#node-body table").first.locator("tbody tr")
    sync_api.expect(rows.nth(1).locator(".pill.shared")).to_have_text("shared 75 %")
    assert rows.nth(0).locator(".pill").count() == 0

    page.wait_for_timeout(300)
    page.screenshot(path="/tmp/mig_page.png")
