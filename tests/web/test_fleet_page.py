"""The fleet page in a real headless Chromium (Debian's /usr/bin/chromium, driven by
Playwright; no browser is downloaded): against the demo fleet it signs in, shows 400 GPU
tiles, opens a node, shows the queue, the running jobs and usage and cost per team (table
and chart), updates live, and works from the keyboard; a synthetic 4,000-GPU snapshot
stays on about one screen. The screenshot is saved to ``test-artifacts/fleet.png``."""

from __future__ import annotations

import json
import random
import re
import time
from typing import Any

import pytest

from web.conftest import ARTIFACTS, CHROMIUM, DemoFleet, sign_in

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (Python package) not installed")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="/usr/bin/chromium not installed (Debian: apt-get install chromium)"
)


def test_sign_in_rejects_a_bad_token(page: Any, demo_fleet: DemoFleet) -> None:
    page.goto(demo_fleet.url + "/")
    page.get_by_label("API token").fill("gf_wrong")
    page.get_by_role("button", name="Sign in").click()
    sync_api.expect(page.locator("#login-error")).to_have_text("That token was not accepted.")
    assert page.locator("#app").is_hidden()


def test_fleet_page_against_the_demo(page: Any, demo_fleet: DemoFleet) -> None:
    with demo_fleet.client() as c:  # a job too big to start now, so the queue has a known entry
        big = c.post("/jobs", json={"command": ["sleep", "1"], "gpus": 400, "priority": -100, "name": "big"})
        assert big.status_code == 201, big.text
        jid = big.json()["id"]
    try:
        sign_in(page, demo_fleet.url, demo_fleet.token)
        assert page.locator("#heatmap .tile").count() == 400
        assert page.locator("#heatmap .node").count() == 50
        assert page.locator("#heatmap .rack").count() == 3 and page.locator("#heatmap .leaf").count() == 5
        stored = page.evaluate("sessionStorage.getItem('gpufleet.token')")  # a web session, not the API token
        assert stored.startswith("gf_") and stored != demo_fleet.token
        title = page.locator("#heatmap .tile").first.get_attribute("title")
        assert title and title.startswith("node-000 GPU 0")
        sync_api.expect(page.locator("#k-nodes")).to_have_text("50 / 50")

        # a busy node: its chart, GPU table and jobs
        busy = page.locator("#heatmap .node", has=page.locator(".tile[title*='job ']")).first
        name = busy.get_attribute("data-node")
        busy.click()
        sync_api.expect(page.locator("#node-title")).to_have_text(name)
        sync_api.expect(page.locator("#node-body svg[role=img]")).to_have_count(2)
        sync_api.expect(page.locator("#node-body table").first.locator("tbody tr")).to_have_count(8)
        sync_api.expect(page.locator("#node-body").get_by_text("RUNNING").first).to_be_visible()

        # the queue (with the big job, its position and reason) and the running jobs
        row = page.locator("#queue tr", has_text=f"#{jid} big")
        sync_api.expect(row).to_be_visible(timeout=10_000)
        sync_api.expect(row.locator(".code")).to_have_count(1)
        assert page.locator("#running tbody tr").count() > 0
        # usage and cost this month: a row per team (speech has its demo budget), the chart
        usage = page.locator("#usage-table tbody tr")
        page.wait_for_function(
            "document.querySelectorAll('#usage-table tbody tr').length > 0", timeout=30_000
        )
        speech = page.locator("#usage-table tbody tr", has_text="speech")
        sync_api.expect(speech).to_contain_text("soft 25 · hard 60")
        assert usage.count() >= 1
        chart = page.locator("#usage svg[role=img]")
        sync_api.expect(chart).to_have_count(1)
        assert (chart.get_attribute("aria-label") or "").startswith("Cost this month per team: ")
        assert chart.locator("rect.bar").count() == usage.count()
        sync_api.expect(page.locator("#usage-period")).to_contain_text("Europe/Berlin")
        # reservations: the demo's bookings on the week's calendar, one lane each (the daily
        # window's five repeats share theirs), the maintenance window marked, exact times below
        page.wait_for_function(
            "document.querySelectorAll('#reservations .cal-row').length === 3", timeout=30_000
        )
        lanes = page.locator("#reservations .cal-row")
        sprint = lanes.filter(has_text="vision-sprint")
        sync_api.expect(sprint).to_contain_text("vision · 5 windows")
        sync_api.expect(sprint.locator(".cal-bar.BOOKED")).to_have_count(5)
        label = sprint.locator(".cal-bar").first.get_attribute("aria-label") or ""
        assert "16 GPUs" in label and "booked" in label, label
        sync_api.expect(lanes.filter(has_text="driver upgrade").locator(".cal-bar.maint")).to_have_count(1)
        sync_api.expect(lanes.filter(has_text="eval-run")).to_contain_text("language")
        assert page.locator("#reservations .cal-now").count() == 1
        page.locator("#reservations summary").click()
        sync_api.expect(page.locator("#reservations details tbody tr")).to_have_count(7)
        sync_api.expect(page.locator("#resv-count")).to_have_text("7 active or booked")

        # live: the status line changes without a reload (and the workload gets going
        # for the screenshot: up to 15 s more for a few dozen busy GPUs, and until the
        # usage section shows cost)
        with demo_fleet.client() as c:
            deadline = time.monotonic() + 15
            while c.get("/fleet/summary").json()["gpus_busy"] < 40 and time.monotonic() < deadline:
                time.sleep(1)
        page.wait_for_function(
            "[...document.querySelectorAll('#usage svg rect.bar')].some(r => +r.getAttribute('width') > 0)",
            timeout=30_000,
        )
        before = page.locator("#live").inner_text()
        page.wait_for_function(
            "b => document.getElementById('live').innerText !== b", arg=before, timeout=10_000
        )
        page.wait_for_timeout(300)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "fleet.png"), full_page=True)
    finally:
        with demo_fleet.client() as c:
            c.post(f"/jobs/{jid}/cancel")


def test_keyboard_navigation(page: Any, demo_fleet: DemoFleet) -> None:
    sign_in(page, demo_fleet.url, demo_fleet.token)
    nodes = page.locator("#heatmap .node")
    assert [nodes.nth(i).get_attribute("tabindex") for i in range(3)] == ["0", "-1", "-1"]
    nodes.first.focus()
    page.keyboard.press("ArrowRight")
    assert page.evaluate("document.activeElement.dataset.node") == "node-001"
    page.keyboard.press("ArrowDown")
    below = page.evaluate("document.activeElement.dataset.node")
    assert below == "node-006"
    page.keyboard.press("Enter")
    sync_api.expect(page.locator("#node-title")).to_have_text(below)
    page.keyboard.press("Escape")
    sync_api.expect(page.locator("#node-title")).to_have_text("Node")
    assert page.evaluate("document.activeElement.dataset.node") == below
    label = nodes.nth(6).get_attribute("aria-label") or ""
    assert label.startswith("node-006, Ready") and "GPUs allocated" in label


def synthetic_snapshot(nodes: int, per_node: int = 8) -> dict[str, Any]:
    rng = random.Random(nodes)
    out = []
    for i in range(nodes):
        gpus = []
        for g in range(per_node):
            util = rng.choice([None, 0.0, rng.uniform(5, 100)])
            flags = (
                (8 if util else 0) | (1 if rng.random() < 0.01 else 0) | (2 if rng.random() < 0.005 else 0)
            )
            gpus.append([g, util, 60.0, 1000, 81920, flags, 1 if util else None])
        leaf = i // 10
        out.append(
            {
                "name": f"node-{i:04d}",
                "pool": "default",
                "leaf": f"leaf-{leaf}",
                "rack": f"rack-{leaf // 2}",
                "ready": True,
                "cordoned": False,
                "model": "H100",
                "gpus": gpus,
            }
        )
    return {"at": time.time(), "hot_c": 85.0, "jobs": {"RUNNING": 1}, "nodes": out}


@pytest.mark.parametrize(("nodes", "max_height"), [(50, 700), (500, 1200)], ids=["400-gpus", "4000-gpus"])
def test_heatmap_fits_large_fleets(page: Any, demo_fleet: DemoFleet, nodes: int, max_height: int) -> None:
    body = json.dumps(synthetic_snapshot(nodes))
    page.route(
        "**/v1/fleet/snapshot", lambda r: r.fulfill(status=200, content_type="application/json", body=body)
    )
    sign_in(page, demo_fleet.url, demo_fleet.token)
    page.wait_for_function(f"document.querySelectorAll('#heatmap .tile').length === {nodes * 8}")
    tile = page.locator("#heatmap .tile").first.bounding_box()
    heat = page.locator("#heatmap").bounding_box()
    card = page.locator(".heat-card").bounding_box()
    assert tile["width"] >= 6 and tile["height"] >= 6
    assert heat["height"] <= max_height, heat
    assert heat["width"] <= card["width"]  # no horizontal overflow
    if nodes == 500:
        page.locator(".heat-card").screenshot(path=str(ARTIFACTS / "fleet-4000.png"))


@pytest.mark.parametrize(
    ("gpus", "tile", "compact"),
    [(8, 16, False), (400, 16, False), (4000, 7, True), (40_000, 6, True)],
    ids=["8", "400", "4000", "40000"],
)
def test_layout_function(page: Any, demo_fleet: DemoFleet, gpus: int, tile: int, compact: bool) -> None:
    page.goto(demo_fleet.url + "/")
    got = page.evaluate(f"GF.layout({gpus}, 8, 1130, 750)")
    assert (got["tile"], got["compact"], got["gcols"]) == (tile, compact, 4)


def usage_row(key: str, cost: float, util: float | None) -> dict[str, Any]:
    return {"key": key, "jobs": 1, "gpu_hours": 2.0, "cost": cost, "energy_kwh": 1.0,
            "avg_util_pct": util, "idle_gpu_hours": 0.5}  # fmt: skip


USAGE = {"rows": [usage_row("vision", 12.5, 80.0), usage_row("speech", 57.0, None)]}
TEAMS = [
    {"name": "audio", "budget_soft": None, "budget_hard": 50.0},
    {"name": "demo", "budget_soft": None, "budget_hard": None},
    {"name": "speech", "budget_soft": 25.0, "budget_hard": 60.0},
    {"name": "vision", "budget_soft": 10.0, "budget_hard": 100.0},
]


@pytest.mark.parametrize(
    ("me", "want"),
    [
        (
            {"role": "admin", "teams": ["demo"]},
            [("speech", 57.0, "near limit"), ("vision", 12.5, "over soft"), ("audio", 0, "ok")],
        ),
        # a plain user: the server sent their teams' usage only; their idle team shows too
        ({"role": "user", "teams": ["demo", "vision"]}, [("vision", 12.5, "over soft"), ("demo", 0, "")]),
    ],
    ids=["admin", "user"],
)
def test_team_usage_rows(
    page: Any, demo_fleet: DemoFleet, me: dict[str, Any], want: list[tuple[str, float, str]]
) -> None:
    page.goto(demo_fleet.url + "/")
    usage = USAGE if me["role"] == "admin" else {"rows": USAGE["rows"][:1]}
    rows = page.evaluate("a => GF.teamUsage(a[0], a[1], a[2])", [usage, TEAMS, me])
    assert [(r["team"], r["cost"], r["status"]) for r in rows] == want


# -- a page that agrees with itself (issue 20) ----------------------------------------------

HOT, ERROR, CORD, BUSY = 1, 2, 4, 8


def snap_node(
    name: str, *, ready: bool = True, cordoned: bool = False, flags: tuple[int, ...] = (0,) * 8
) -> dict[str, Any]:
    gpus = [[i, 50.0, 60.0, 1000, 81920, f, None] for i, f in enumerate(flags)]
    return {"name": name, "pool": "default", "leaf": "leaf-0", "rack": "rack-0", "ready": ready,
            "cordoned": cordoned, "cordon_reason": "maintenance" if cordoned else None,
            "cordoned_gpus": {}, "model": "H100", "gpus": gpus}  # fmt: skip


def counts(nodes: int = 0, not_ready: int = 0, cordoned_nodes: int = 0, gpus: int = 0, cordoned: int = 0,
           error: int = 0, hot: int = 0) -> dict[str, int]:  # fmt: skip
    return {"nodes": nodes, "notReady": not_ready, "cordonedNodes": cordoned_nodes, "gpus": gpus,
            "cordoned": cordoned, "error": error, "hot": hot}  # fmt: skip


@pytest.mark.parametrize(
    ("nodes", "want", "text"),
    [
        ([snap_node("n1"), snap_node("n2", flags=(BUSY,) * 8)], counts(), "none"),
        # a NotReady node counts once, as a node, whatever its GPUs show
        (
            [snap_node("n1", ready=False, flags=(HOT, ERROR) + (0,) * 6)],
            counts(nodes=1, not_ready=1),
            "1 node",
        ),
        ([snap_node("n1", cordoned=True, flags=(CORD,) * 8)], counts(nodes=1, cordoned_nodes=1), "1 node"),
        (
            [snap_node("n1", ready=False, cordoned=True, flags=(CORD,) * 8), snap_node("n2")],
            counts(nodes=1, not_ready=1, cordoned_nodes=1),
            "1 node",
        ),
        # on a node in service, each GPU that is cordoned, in error or hot counts once
        (
            [
                snap_node("n1", flags=(CORD, ERROR | HOT, HOT | BUSY, BUSY)),
                snap_node("n2", cordoned=True, flags=(CORD,) * 4),
            ],
            counts(nodes=1, cordoned_nodes=1, gpus=3, cordoned=1, error=1, hot=2),
            "1 node · 3 GPUs",
        ),
        ([snap_node("n1", flags=(ERROR, 0))], counts(gpus=1, error=1), "1 GPU"),
        (
            [snap_node("n1", cordoned=True), snap_node("n2", ready=False), snap_node("n3", flags=(0, CORD))],
            counts(nodes=2, not_ready=1, cordoned_nodes=1, gpus=1, cordoned=1),
            "2 nodes · 1 GPU",
        ),
    ],
    ids=["none", "notready", "cordoned-node", "notready-and-cordoned", "gpus", "one-gpu", "issue-20"],
)
def test_attention_function(
    page: Any, demo_fleet: DemoFleet, nodes: list[dict[str, Any]], want: dict[str, int], text: str
) -> None:
    page.goto(demo_fleet.url + "/")
    got = page.evaluate("ns => [GF.attention(ns), GF.attentionText(GF.attention(ns))]", nodes)
    assert got == [want, text]


@pytest.mark.parametrize(
    ("names", "want"),
    [
        ([], ""),
        (["node-004"], "node-004"),
        ([f"node-{i:03d}" for i in range(1, 33)], "node-[001-032]"),
        (["node-007", "node-001", "node-002", "node-004", "node-005"], "node-[001-002,004-005,007]"),
        (["node-9", "node-10", "node-11"], "node-[9-11]"),
        (["node-099", "node-100"], "node-[099-100]"),
        (["node-09", "node-010"], "node-[09,010]"),  # each expands back to what it was
        (["n1", "n1", "n2"], "n[1-2]"),
        (["b-2", "a-1", "a-2"], "a-[1-2],b-2"),
        (["rack1-node3", "rack1-node4", "rack2-node3"], "rack1-node[3-4],rack2-node3"),
        (["gpu-box", "node-001"], "node-001,gpu-box"),
    ],
    ids=[
        "empty",
        "one",
        "run",
        "runs",
        "unpadded",
        "padded-carry",
        "widths",
        "dupes",
        "prefixes",
        "nested",
        "no-number",
    ],
)
def test_hostlist_function(page: Any, demo_fleet: DemoFleet, names: list[str], want: str) -> None:
    page.goto(demo_fleet.url + "/")
    assert page.evaluate("ns => GF.hostlist(ns)", names) == want


@pytest.mark.parametrize(
    ("nums", "want"),
    [([], ""), ([7], "7"), ([0, 1, 2, 3, 5], "0-3,5"), ([3, 1, 2, 2], "1-3"), ([0, 2, 4], "0,2,4")],
    ids=["empty", "one", "run-and-one", "unsorted", "gaps"],
)
def test_ranges_function(page: Any, demo_fleet: DemoFleet, nums: list[int], want: str) -> None:
    page.goto(demo_fleet.url + "/")
    assert page.evaluate("xs => GF.ranges(xs)", nums) == want


def alloc(*parts: tuple[str, list[int]]) -> list[dict[str, Any]]:
    return [{"node": n, "gpus": g} for n, g in parts]


BIG = alloc(*[(f"node-{i:03d}", list(range(8))) for i in range(10, 42)])


@pytest.mark.parametrize(
    ("allocation", "text", "first_line", "nodes"),
    [
        ([], "\u2013", "", 0),
        (alloc(("node-004", [0, 1, 2, 3])), "node-004 · GPUs 0-3", "node-004: GPUs 0-3", 1),
        (alloc(("node-004", [5])), "node-004 · GPU 5", "node-004: GPU 5", 1),
        (alloc(("node-004", [])), "node-004 · no GPUs", "node-004: no GPUs", 1),
        (alloc(("node-004", [0, 2]), ("node-004", [1])), "node-004 · GPUs 0-2", "node-004: GPUs 0-2", 1),
        (BIG, "node-[010-041] · 8 GPUs each", "node-010: GPUs 0-7", 32),
        (
            alloc(("n-3", [0, 1]), ("n-1", [6, 7]), ("n-2", list(range(8)))),
            "n-[1-3] · 2-8 GPUs per node",
            "n-1: GPUs 6-7",
            3,
        ),
    ],
    ids=["none", "one-node", "one-gpu", "cpu-only", "merged", "256-gpus", "uneven"],
)
def test_where_function(
    page: Any, demo_fleet: DemoFleet, allocation: list[dict[str, Any]], text: str, first_line: str, nodes: int
) -> None:
    page.goto(demo_fleet.url + "/")
    got = page.evaluate("a => GF.where(a)", allocation)
    assert (got["text"], got["detail"].split("\n")[0], got["nodes"]) == (text, first_line, nodes)


def job(jid: int, state: str, allocation: list[dict[str, Any]], *, gpus: int = 0) -> dict[str, Any]:
    started = None if state == "SCHEDULED" else time.time() - 60 * jid
    return {"id": jid, "name": f"job-{jid}", "user": "alice", "team": "language", "state": state,
            "gpus": gpus or sum(len(a["gpus"]) for a in allocation), "allocation": allocation,
            "started_at": started, "submit_time": time.time() - 4000}  # fmt: skip


@pytest.mark.parametrize(
    ("page_", "want"),
    [
        ({"items": [job(1, "RUNNING", []), job(2, "SCHEDULED", [])], "next_cursor": None},
         {"total": 2, "shown": 2, "starting": 1, "more": False, "text": "2"}),
        ({"items": [job(i, "RUNNING", []) for i in range(200)], "next_cursor": "199"},
         {"total": 200, "shown": 200, "starting": 0, "more": True, "text": "200+"}),
        ({"items": [job(1, "RUNNING", [])], "next_cursor": "1", "total": 5},
         {"total": 5, "shown": 1, "starting": 0, "more": True, "text": "5"}),
        ({"items": [], "next_cursor": None},
         {"total": 0, "shown": 0, "starting": 0, "more": False, "text": "0"}),
    ],
    ids=["some", "cut", "with-total", "none"],
)  # fmt: skip
def test_job_counts_function(
    page: Any, demo_fleet: DemoFleet, page_: dict[str, Any], want: dict[str, Any]
) -> None:
    page.goto(demo_fleet.url + "/")
    assert page.evaluate("p => GF.jobCounts(p)", page_) == want


def test_running_kpi_and_card_agree(page: Any, demo_fleet: DemoFleet) -> None:
    """The Running KPI and the Running card count the same page of the same poll (whatever
    the snapshot's job counts say); a 256-GPU job's Where is a hostlist, opens to each
    node's GPUs, stays open across polls and does not overflow its table."""
    running = {
        "items": [
            job(1, "RUNNING", alloc(("node-004", [0, 1, 2, 3]))),
            job(2, "SCHEDULED", alloc(("node-005", [0]))),
            job(3, "RUNNING", BIG, gpus=256),
        ],
        "next_cursor": None,
    }
    body = json.dumps(running)
    page.route(
        re.compile(r"/v1/jobs\?state=RUNNING"),
        lambda r: r.fulfill(status=200, content_type="application/json", body=body),
    )
    sign_in(page, demo_fleet.url, demo_fleet.token)
    page.wait_for_function("document.querySelectorAll('#running tbody tr').length === 3")
    got = page.evaluate("['k-running', 'running-count'].map(id => document.getElementById(id).textContent)")
    assert got == ["3 · 1 starting", "3 · 1 starting"]
    assert "SCHEDULED" in (page.locator("#k-running").locator("xpath=..").get_attribute("title") or "")

    small = page.locator("#running tbody tr", has_text="#1 job-1").locator("td").nth(3)
    sync_api.expect(small).to_have_text("node-004 · GPUs 0-3")
    row = page.locator("#running tbody tr", has_text="#3 job-3")
    summary = row.locator("details.where summary")
    sync_api.expect(summary).to_have_text("node-[010-041] · 8 GPUs each")
    title = summary.get_attribute("title") or ""
    assert len(title.split("\n")) == 32 and title.endswith("node-041: GPUs 0-7"), title
    fits = page.evaluate(
        "[...document.querySelectorAll('#running .table-wrap, #running td')]"
        ".every(e => e.scrollWidth <= e.clientWidth + 1)"
    )
    assert fits, "the running table overflows"
    summary.click()
    sync_api.expect(row.locator(".where-list li")).to_have_count(32)
    before = page.locator("#live").inner_text()
    page.wait_for_function("b => document.getElementById('live').innerText !== b", arg=before, timeout=10_000)
    assert row.locator("details.where").get_attribute("open") is not None  # still open after a poll


def test_cordons_agree_across_the_page(page: Any, demo_fleet: DemoFleet) -> None:
    """Two cordoned nodes and a cordoned GPU: the snapshot carries the reasons, the
    Attention KPI counts what the heatmap hatches, the node panel says why."""
    cordons = [
        ("node-003", {"reason": "PSU swap, OPS-1234"}),
        ("node-017", {}),
        ("node-021", {"gpu": 5, "reason": "XID 79: fell off the bus"}),
    ]
    with demo_fleet.client() as c:
        for name, spec in cordons:
            r = c.post(f"/nodes/{name}/cordon", json=spec)
            assert r.status_code == 200, r.text
    try:
        with demo_fleet.client() as c:
            deadline = time.monotonic() + 10
            while True:  # the fleet view is cached for a second
                by = {n["name"]: n for n in c.get("/fleet/snapshot").json()["nodes"]}
                if by["node-021"]["cordoned_gpus"] or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
        assert (by["node-003"]["cordoned"], by["node-003"]["cordon_reason"]) == (True, "PSU swap, OPS-1234")
        assert (by["node-017"]["cordon_reason"] or "").startswith("cordoned by ")
        assert (by["node-021"]["cordon_reason"], by["node-021"]["cordoned_gpus"]) == (
            None,
            {"5": "XID 79: fell off the bus"},
        )
        assert (by["node-000"]["cordon_reason"], by["node-000"]["cordoned_gpus"]) == (None, {})

        sign_in(page, demo_fleet.url, demo_fleet.token)
        page.wait_for_function("document.querySelectorAll('#heatmap .tile.cord').length >= 17")
        seen = page.evaluate("""() => {
          let whole = 0, gpus = 0;
          for (const b of document.querySelectorAll('#heatmap .node')) {
            const tiles = [...b.querySelectorAll('.tile')];
            const down = b.classList.contains('notready') || tiles.every(t => t.classList.contains('cord'));
            if (down) { whole++; continue; }
            gpus += tiles.filter(t => /\\b(cord|err|hot)\\b/.test(t.className)).length;
          }
          const k = document.getElementById('k-attn');
          return { whole, gpus, kpi: k.textContent, title: k.parentNode.title, warn: k.className };
        }""")  # fmt: skip
        assert seen["whole"] >= 2 and seen["gpus"] >= 1, seen
        plural = lambda n, w: f"{n} {w}" + ("" if n == 1 else "s")  # noqa: E731
        assert seen["kpi"] == plural(seen["whole"], "node") + " · " + plural(seen["gpus"], "GPU"), seen
        assert seen["warn"] == "warn"
        assert seen["title"].startswith("Needs attention: ") and "counts once, as a node" in seen["title"]

        # the node panel: a GPU cordon with its reason, the GPU's state in its row
        page.locator('#heatmap .node[data-node="node-021"]').click()
        attn = page.locator("#node-body .attn")
        sync_api.expect(attn).to_contain_text("GPU 5 cordoned: XID 79: fell off the bus")
        sync_api.expect(page.locator("#node-body .node-meta")).to_contain_text("1 GPU cordoned")
        rows = page.locator("#node-body table").first.locator("tbody tr")
        sync_api.expect(rows.nth(5).locator(".pill.cordoned")).to_have_count(1)
        assert (
            rows.nth(5).locator(".pill.cordoned").get_attribute("title")
            == "GPU cordoned: XID 79: fell off the bus"
        )
        assert page.locator("#node-body table").first.locator(".pill.cordoned").count() == 1
        label = page.locator('#heatmap .node[data-node="node-021"]').get_attribute("aria-label") or ""
        assert "1 GPU needs attention" in label or "GPUs need attention" in label, label

        # a cordoned node: the whole node, its reason, every GPU cordoned
        page.locator('#heatmap .node[data-node="node-003"]').click()
        sync_api.expect(attn).to_contain_text("Node cordoned: PSU swap, OPS-1234")
        sync_api.expect(attn.locator("h3")).to_have_text("Needs attention: the whole node")
        sync_api.expect(page.locator("#node-body .node-meta .pill.cordoned")).to_have_text("cordoned")
        sync_api.expect(page.locator("#node-body table").first.locator(".pill.cordoned")).to_have_count(8)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "fleet-cordons.png"))
    finally:
        with demo_fleet.client() as c:
            c.post("/nodes/node-003/uncordon", json={})
            c.post("/nodes/node-017/uncordon", json={})
            c.post("/nodes/node-021/uncordon", json={"gpu": 5})


@pytest.mark.parametrize("resized", [False, True], ids=["at-900", "resized-to-900"])
def test_narrow_window(page: Any, demo_fleet: DemoFleet, resized: bool) -> None:
    """At 900 px (from the start, or after signing in at 1600 px): the header in two rows
    (brand and session, then the KPIs in one row), the heatmap's racks across the width,
    the node panel under the heatmap only while a node is open. Saves
    test-artifacts/fleet-900.png."""
    if not resized:
        page.set_viewport_size({"width": 900, "height": 900})
    sign_in(page, demo_fleet.url, demo_fleet.token)
    page.wait_for_function("document.querySelectorAll('#heatmap .tile').length === 400")
    if resized:
        page.set_viewport_size({"width": 900, "height": 900})
        page.wait_for_timeout(400)  # the page re-sizes its tiles 150 ms after the last resize
    sync_api.expect(page.locator("#who")).to_have_text("Signed in as admin (role: admin)")
    m = page.evaluate("""() => {
      const box = e => e.getBoundingClientRect(), heat = box(document.getElementById('heatmap'));
      return {
        header: box(document.querySelector('.topbar')).height,
        kpiTops: [...document.querySelectorAll('#kpis > div')].map(d => Math.round(box(d).top)),
        brand: box(document.querySelector('.brand')), session: box(document.getElementById('session')),
        heatLeft: heat.left, heatWidth: heat.width,
        racksRight: Math.max(...[...document.querySelectorAll('#heatmap .rack')].map(r => box(r).right)),
        pageWidth: document.documentElement.scrollWidth,
        panel: getComputedStyle(document.getElementById('node-panel')).display,
      };
    }""")  # fmt: skip
    assert m["header"] <= 2 * 64, m  # at most two rows (one row is ~60 px)
    assert max(m["kpiTops"]) - min(m["kpiTops"]) <= 2, m  # the KPIs on one row
    assert m["session"]["top"] < m["brand"]["bottom"], m  # brand and session share the first
    assert m["racksRight"] - m["heatLeft"] >= 0.85 * 900, m  # the racks use the width
    assert m["heatWidth"] >= 0.85 * 900 and m["pageWidth"] <= 900, m
    assert m["panel"] == "none", m

    page.locator('#heatmap .node[data-node="node-000"]').click()
    panel = page.locator("#node-panel")
    sync_api.expect(page.locator("#node-title")).to_have_text("node-000")
    sync_api.expect(page.locator("#node-body svg[role=img]")).to_have_count(2)
    assert "null" not in page.locator("#node-body").inner_text()
    heat, card = page.locator("#heatmap").bounding_box(), panel.bounding_box()
    assert card["y"] >= heat["y"] + heat["height"] and card["width"] >= 0.85 * 900, (heat, card)
    if not resized:
        page.wait_for_timeout(300)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "fleet-900.png"), full_page=True)
    page.keyboard.press("Escape")
    sync_api.expect(panel).to_be_hidden()
