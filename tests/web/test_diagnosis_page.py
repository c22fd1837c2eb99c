"""Failure diagnosis on the fleet page (issue 34) in a real headless Chromium (Debian's
/usr/bin/chromium, driven by Playwright): a suspect node is marked on its tile with the
reason in its tooltip, a node the diagnosis cordoned says so, and a node's detail lists
its recent failed jobs with signature, diagnosis, hint and matching line; a job name and
an output line full of markup show as those characters and never run or render (no
script, no image, no dialog). A plain user's page shows others' failures without their
names and lines. The screenshot goes to ``$TMPDIR/diagnosis-page.png``.

A server of its own (SQLite) with three agentless nodes, synced by the test as their
agents would (the jobs' states and closed logs): lighter than the 50-node demo."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from server.conftest import (
    ADMIN_TOKEN,
    Server,
    make_node,
    make_pool,
    make_team,
    make_user,
    start_server,
    stop_server,
)
from server.test_diagnosis_page import MARKUP, XID79, fail_on, read, settled_tile
from web.conftest import CHROMIUM, sign_in

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (Python package) not installed")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="/usr/bin/chromium not installed (Debian: apt-get install chromium)"
)
SUSPECT = re.compile(r"(^|\s)suspect(\s|$)")
IB = (
    "ddp-worker-0:3468:3905 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer "
    "10.1.2.36<54862> with status=12 opcode=0 len=0 vendor err 129 (Recv)"
)


@dataclass(frozen=True)
class Scene:
    server: Server
    suspect: str
    """one user's job failed there with an XID 79: suspect, not cordoned"""
    cordoned: str
    """three users' jobs failed there with an XID 79: the diagnosis cordoned it"""
    clean: str
    evil: int
    """the job with markup in its name and output (on ``suspect``)"""
    user: str
    """a plain user's token (owns none of ``suspect``'s jobs)"""


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    srv = start_server(f"sqlite:///{tmp_path_factory.mktemp('diagpage') / 'gpufleet.db'}")
    try:
        team = make_team(srv)
        pools = [make_pool(srv) for _ in range(3)]  # a pool each: a job lands on the node meant
        suspect, cordoned, clean = (
            make_node(srv, pool=p, gpus=4, name=f"gpu-{i:03d}") for i, p in enumerate(pools)
        )
        pool = pools[0]
        alice, bob, carol = (make_user(srv, team=team) for _ in range(3))
        oom = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
        j1 = fail_on(srv, suspect, pool, token=alice, team=team, name="resnet-oom", output=oom)
        j2 = fail_on(srv, suspect, pool, token=alice, team=team, name="llama-ddp", output=f"step 9\n{IB}\n")
        evil = fail_on(
            srv, suspect, pool, token=alice, team=team, name=f"train {MARKUP}", output=f"{MARKUP} {XID79}"
        )
        for i, token in enumerate((alice, bob, carol)):
            read(
                srv,
                cordoned,
                fail_on(srv, cordoned, pools[1], token=token, team=team, name=f"x{i}", output=XID79),
            )
        for job in (j1, j2, evil):
            read(srv, suspect, job)
        settled_tile(srv, cordoned, lambda n: n.get("suspect", {}).get("cordoned"))
        settled_tile(srv, suspect, lambda n: "suspect" in n)
        yield Scene(
            server=srv,
            suspect=suspect,
            cordoned=cordoned,
            clean=clean,
            evil=evil,
            user=make_user(srv, team=team),
        )
    finally:
        stop_server(srv)


def dialogs(page: Any) -> list[str]:
    seen: list[str] = []
    page.on("dialog", lambda d: (seen.append(d.message), d.dismiss()))
    return seen


def tile(page: Any, node: str) -> Any:
    return page.locator(f"#heatmap .node[data-node='{node}']")


def test_suspect_and_cordoned_nodes_are_marked_with_the_reason(page: Any, scene: Scene) -> None:
    opened = dialogs(page)
    sign_in(page, scene.server.url, ADMIN_TOKEN)
    sync_api.expect(page.locator(".legend .sw.suspect")).to_have_count(1)
    sync_api.expect(tile(page, scene.suspect)).to_have_class(SUSPECT)
    title = tile(page, scene.suspect).get_attribute("title") or ""
    assert "suspect: xid-79-fell-off-bus (a GPU fell off the bus" in title, title
    assert "failed jobs of 1 of 3 users within 24 h (job " in title and "cordoned at 3 users" in title
    cord = tile(page, scene.cordoned).get_attribute("title") or ""
    assert "cordoned by failure diagnosis: xid-79-fell-off-bus" in cord and "3 of 3 users" in cord, cord
    assert "suspect" not in (tile(page, scene.clean).get_attribute("class") or "")
    assert "suspect" not in (tile(page, scene.clean).get_attribute("title") or "")
    # the cordoned node's detail says who cordoned it and why
    tile(page, scene.cordoned).click()
    attn = page.locator("#node-body .attn")
    sync_api.expect(attn).to_contain_text("Cordoned by failure diagnosis: xid-79-fell-off-bus")
    sync_api.expect(page.locator("#node-body .node-meta .pill.suspect")).to_have_count(1)
    sync_api.expect(page.locator("#node-body .failures li.failure")).to_have_count(3)
    assert opened == []


def test_a_nodes_recent_failures_with_markup_shown_as_text(page: Any, scene: Scene) -> None:
    opened = dialogs(page)
    sign_in(page, scene.server.url, ADMIN_TOKEN)
    tile(page, scene.suspect).click()
    items = page.locator("#node-body .failures li.failure")
    sync_api.expect(items).to_have_count(3)
    evil = page.locator(f"#node-body li.failure[data-job='{scene.evil}']")
    sync_api.expect(evil.locator(".f-name")).to_have_text(f"train {MARKUP}")
    sync_api.expect(evil.locator(".f-sig")).to_have_text("xid-79-fell-off-bus")
    sync_api.expect(evil.locator(".f-hint")).to_contain_text("drain the node")
    sync_api.expect(evil.locator(".f-line")).to_contain_text(MARKUP + " NVRM: Xid")
    sync_api.expect(evil.locator(".pill.blame-node")).to_have_text("blames the node")
    # nothing of it became markup: no element, no script run, no dialog
    assert page.locator("#node-body script, #node-body img").count() == 0
    assert page.evaluate("window.__pwned") is None
    assert opened == []
    # newest first; the others' signatures
    sigs = [s.inner_text() for s in page.locator("#node-body .failures .f-sig").all()]
    assert sigs == ["xid-79-fell-off-bus", "nccl-ib-completion-error", "cuda-oom"]
    sync_api.expect(page.locator("#node-body .attn")).to_contain_text("Suspect")
    page.wait_for_timeout(300)
    shot = Path(os.environ.get("TMPDIR", tempfile.gettempdir())) / "diagnosis-page.png"
    page.screenshot(path=str(shot), full_page=True)


def test_a_plain_user_sees_others_failures_without_their_names_and_lines(page: Any, scene: Scene) -> None:
    sign_in(page, scene.server.url, scene.user)
    tile(page, scene.suspect).click()
    items = page.locator("#node-body .failures li.failure")
    sync_api.expect(items).to_have_count(3)
    sync_api.expect(items.locator(".f-name")).to_have_text(["(not yours)"] * 3)
    assert page.locator("#node-body .failures .f-line").count() == 0
    sync_api.expect(items.locator(".f-sig")).to_have_count(3)
    assert "train" not in page.locator("#node-body").inner_text()


CASES = [
    (
        {
            "signature": "s",
            "diagnosis": "d",
            "users": 2,
            "threshold": 3,
            "window_s": 86400,
            "jobs": [4, 5],
            "cordoned": False,
        },
        "suspect: s (d) in failed jobs of 2 of 3 users within 24 h (jobs 4, 5); cordoned at 3 users",
    ),
    (
        {
            "signature": "s",
            "diagnosis": "",
            "users": 1,
            "threshold": 0,
            "window_s": 5400,
            "jobs": [7],
            "cordoned": False,
        },
        "suspect: s in failed jobs of 1 user within 1.5 h (job 7)",
    ),
    (
        {
            "signature": "s",
            "diagnosis": "d",
            "users": 3,
            "threshold": 3,
            "window_s": 3600,
            "jobs": [1, 2, 3],
            "cordoned": True,
        },
        "cordoned by failure diagnosis: s (d) in failed jobs of 3 of 3 users within 1 h (jobs 1, 2, 3); "
        "uncordon it once repaired",
    ),
]


@pytest.mark.parametrize(("suspect", "want"), CASES, ids=["suspect", "never-cordons", "cordoned"])
def test_suspect_text(page: Any, scene: Scene, suspect: dict[str, Any], want: str) -> None:
    page.goto(scene.server.url + "/")
    assert page.evaluate("s => GF.suspectText({suspect: s})", suspect) == want
    assert page.evaluate("() => GF.suspectText({})") is None
