"""The fleet page in a real headless Chromium (Debian's /usr/bin/chromium, driven by
Playwright; no browser is downloaded): against the demo fleet it signs in, shows 400 GPU
tiles, opens a node, shows the queue, the running jobs and usage and cost per team (table
and chart), updates live, and works from the keyboard; a synthetic 4,000-GPU snapshot
stays on about one screen. The screenshot is saved to ``test-artifacts/fleet.png``."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from web.conftest import ARTIFACTS, DemoFleet

CHROMIUM = Path("/usr/bin/chromium")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (Python package) not installed")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="/usr/bin/chromium not installed (Debian: apt-get install chromium)"
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1600, "height": 1000})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on(
        "console",
        lambda m: (
            errors.append(m.text)
            if m.type == "error" and not m.text.startswith("Failed to load resource")  # a refused token: 401
            else None
        ),
    )
    yield pg
    ctx.close()
    assert not errors, errors


def sign_in(page: Any, url: str, token: str) -> None:
    page.goto(url + "/")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_selector("#heatmap .tile")


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
        assert page.evaluate("sessionStorage.getItem('gpufleet.token')") == demo_fleet.token
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
