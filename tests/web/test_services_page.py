"""The fleet page's Services card and the service replicas on its heatmap, in Chromium,
against a server of its own (no agents: replicas are placed on the registered nodes and
stay not ready). An admin sees every service, a plain user only their own, as
``GET /v1/services``: of another user's service neither the card nor the heatmap says
anything. A gateway reports llama's traffic: the card shows its QPS, P99 and 5xx share,
and a chart of the last hour's replicas and QPS. Saves test-artifacts/fleet-services.png
and /tmp/services-traffic.png."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from server.conftest import Server, make_node, make_pool, make_team, make_user, ok, start_server, stop_server
from web.conftest import ARTIFACTS, sign_in

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (Python package) not installed")


@dataclass(frozen=True)
class Fleet:
    server: Server
    alice: str
    """a plain user's token: the owner of alice-svc"""
    bob: str
    """a plain user with no service"""
    placed: dict[str, list[tuple[str, int]]]
    """service -> its replicas' (node, GPU) as GET /v1/services says"""


def _placed(srv: Server, name: str, replicas: int) -> list[tuple[str, int]]:
    with srv.client() as c:
        deadline = time.monotonic() + 15
        while True:
            out = ok(c.get(f"/services/{name}"))
            reps = out["replicas"]
            if len(reps) == replicas and all(r["nodes"] for r in reps):
                break
            assert time.monotonic() < deadline, out
            time.sleep(0.1)
    assert all(len(r["nodes"]) == 1 for r in reps), reps
    return sorted((r["nodes"][0], g) for r in reps for g in r["gpus"])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    srv = start_server(f"sqlite:///{tmp_path_factory.mktemp('svc') / 'gpufleet.db'}")
    try:
        pool = make_pool(srv)
        team = make_team(srv, "inference")
        for i in range(3):
            make_node(srv, pool=pool, gpus=4, name=f"gpu-{i:03d}")
        alice = make_user(srv, team=team, name="alice")
        bob = make_user(srv, team=team, name="bob")
        spec = {"command": ["model-server"], "pool": pool, "protocol": "openai"}
        with srv.client() as c:
            llama = spec | {"name": "llama", "team": team, "replicas": 2, "gpus_per_replica": 2}
            ok(c.put("/services/llama", json=llama))
        with srv.client(alice) as c:
            ok(c.put("/services/alice-svc", json=spec | {"name": "alice-svc", "replicas": 1}))
        placed = {"llama": _placed(srv, "llama", 2), "alice-svc": _placed(srv, "alice-svc", 1)}
        with srv.client() as c:  # a gateway's cumulative counters, a second apart
            for n in (0, 300):
                r = c.post("/gateway/report", json=gateway_report(n))
                assert r.status_code == 204, r.text
                time.sleep(1.0)
        yield Fleet(server=srv, alice=alice, bob=bob, placed=placed)
    finally:
        stop_server(srv)


def gateway_report(requests: int) -> dict[str, Any]:
    """llama: ``requests`` answers, 1 % of them 502; 90 % within 50 ms, all within 250 ms."""
    le = [0.025, 0.05, 0.1, 0.25, 1e9]
    counts = [requests // 2, requests * 9 // 10, requests * 98 // 100, requests, requests]
    codes = {"200": requests - requests // 100, "502": requests // 100}
    latency = {"le": le, "counts": counts, "sum": requests * 0.04, "count": requests}
    return {"gateway": "gw-test", "services": {"llama": {"codes": codes, "inflight": 2, "latency": latency}}}


def marked(page: Any) -> list[tuple[str, int]]:
    """(node, GPU index) of every heatmap tile marked as a service replica's."""
    got = page.evaluate("""() => [...document.querySelectorAll('#heatmap .node')].flatMap(b =>
      [...b.querySelectorAll('.tile')].map((t, i) => [b.dataset.node, i, t.classList.contains('svc')])
        .filter(x => x[2]).map(x => [x[0], x[1]]))""")  # fmt: skip
    return sorted((n, i) for n, i in got)


def test_the_json_keeps_to_the_rules_of_get_services(fleet: Fleet) -> None:
    srv = fleet.server
    with srv.client() as c:
        admin = ok(c.get("/fleet/services"))
        full = {s["name"]: s for s in ok(c.get("/services"))}
    assert [s["name"] for s in admin] == ["alice-svc", "llama"]
    llama = admin[1]
    assert {k: llama[k] for k in ("owner", "team", "protocol", "generation", "state")} == {
        "owner": "admin",
        "team": "inference",
        "protocol": "openai",
        "generation": 1,
        "state": "active",
    }
    assert (llama["replicas_desired"], llama["replicas_ready"], llama["replicas_warm"]) == (2, 0, 0)
    assert llama["traffic"] == full["llama"]["traffic"] and llama["traffic"]["qps"] > 0
    assert admin[0]["traffic"] is None  # no gateway reported alice-svc
    assert llama["history"]["series"] == ["desired", "ready", "warm", "qps"]
    assert llama["history"]["samples"][-1][1:4] == [2, 0, 0]
    want = [
        {
            "job_id": r["job_id"],
            "replica": r["replica"],
            "generation": r["generation"],
            "state": r["state"],
            "ready": r["ready"],
            "draining": r["draining"],
            "warm": r["warm"],
            "endpoint": r["endpoint"],
            "allocation": [{"node": r["nodes"][0], "gpus": r["gpus"]}],
        }
        for r in sorted(full["llama"]["replicas"], key=lambda r: r["replica"])
    ]
    assert llama["replicas"] == want
    assert len({r["allocation"][0]["node"] for r in llama["replicas"]}) == 2  # spread
    with srv.client(fleet.alice) as c:
        assert [s["name"] for s in ok(c.get("/fleet/services"))] == ["alice-svc"]
    with srv.client(fleet.bob) as c:
        assert ok(c.get("/fleet/services")) == []


def test_an_admin_sees_every_service_and_its_replicas_on_the_heatmap(page: Any, fleet: Fleet) -> None:
    sign_in(page, fleet.server.url, "gf_test_admin_token")
    rows = page.locator("#services tbody tr")
    sync_api.expect(rows).to_have_count(2)
    sync_api.expect(page.locator("#svc-count")).to_have_text("2 services · 0 / 3 replicas ready")
    llama = rows.filter(has_text="llama")
    sync_api.expect(llama).to_contain_text("admin · inference · openai")
    badge = llama.locator(".pill.svc-down")
    sync_api.expect(badge).to_have_text("0 / 2")
    reps = llama.locator(".replicas li")
    sync_api.expect(reps).to_have_count(2)
    held: dict[str, list[int]] = {}  # where the server placed each replica (one node each)
    for n, g in fleet.placed["llama"]:
        held.setdefault(n, []).append(g)
    texts = sorted(reps.all_inner_texts())
    assert texts == [f"{n}:{min(g)}-{max(g)} starting" for n, g in sorted(held.items())], texts
    sync_api.expect(rows.filter(has_text="alice-svc").locator(".replicas li")).to_contain_text("starting")

    # the heatmap marks exactly the replicas' GPUs, each tile saying whose it is
    page.wait_for_function("document.querySelectorAll('#heatmap .tile.svc').length === 5")
    assert marked(page) == sorted(fleet.placed["llama"] + fleet.placed["alice-svc"])
    node, gpu = fleet.placed["llama"][0]
    tile = page.locator(f'#heatmap .node[data-node="{node}"] .tile').nth(gpu)
    assert "service llama replica " in (tile.get_attribute("title") or "")
    label = page.locator(f'#heatmap .node[data-node="{node}"]').get_attribute("aria-label") or ""
    assert "to service replicas" in label, label
    # the node panel's GPU table names the replica
    page.locator(f'#heatmap .node[data-node="{node}"]').click()
    gpus = page.locator("#node-body table").first
    sync_api.expect(gpus.locator("tbody tr").nth(gpu)).to_contain_text("llama replica")

    page.locator("#services").scroll_into_view_if_needed()
    page.wait_for_timeout(200)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "fleet-services.png"), full_page=True)


@pytest.mark.parametrize(
    ("user", "want", "tiles"),
    [("alice", ["alice-svc"], 1), ("bob", [], 0)],
    ids=["owner-of-one", "owner-of-none"],
)
def test_a_plain_user_sees_only_their_own(
    page: Any, fleet: Fleet, user: str, want: list[str], tiles: int
) -> None:
    sign_in(page, fleet.server.url, fleet.alice if user == "alice" else fleet.bob)
    page.wait_for_function("document.querySelector('#services table, #services .empty') !== null")
    box = page.locator("#services")
    if want:
        sync_api.expect(box.locator("tbody tr")).to_have_count(1)
        sync_api.expect(box.locator("tbody tr")).to_contain_text("alice-svc")
        sync_api.expect(box.locator(".pill.svc-down")).to_have_text("0 / 1")
    else:
        sync_api.expect(box.locator(".empty")).to_have_text(
            "You have no inference services. Deploy one with gpufleet service deploy."
        )
    # the admin's service: not in the card, not on the heatmap (its GPUs show as busy only)
    assert "llama" not in box.inner_text()
    page.wait_for_function("document.querySelectorAll('#heatmap .tile[title*=\"job \"]').length === 5")
    assert marked(page) == sorted(fleet.placed["alice-svc"] if want else [])
    assert len(marked(page)) == tiles
    titles = page.evaluate("[...document.querySelectorAll('#heatmap .tile')].map(t => t.title).join('\\n')")
    assert "llama" not in titles


NONE = "\u2013"  # the page's dash for "nowhere yet"
REPLICA = {"draining": False, "ready": False, "warm": False, "state": "RUNNING", "allocation": []}


@pytest.mark.parametrize(
    ("replica", "state", "where"),
    [
        ({"state": "PENDING"}, "pending", NONE),
        ({"state": "HELD"}, "pending", NONE),
        (
            {"state": "SCHEDULED", "allocation": [{"node": "n-1", "gpus": [0, 1, 2, 5]}]},
            "starting",
            "n-1:0-2,5",
        ),
        ({"ready": True, "allocation": [{"node": "n-1", "gpus": [3]}]}, "ready", "n-1:3"),
        ({"ready": True, "draining": True}, "draining", NONE),
        ({"ready": True, "warm": True, "allocation": [{"node": "n-1", "gpus": [4]}]}, "warm", "n-1:4"),
        ({"ready": True, "warm": True, "draining": True}, "draining", NONE),
        (
            {"allocation": [{"node": "a", "gpus": [0, 1]}, {"node": "b", "gpus": [0, 1]}]},
            "starting",
            "a:0-1 b:0-1",
        ),
        ({"allocation": [{"node": "cpu-1", "gpus": []}]}, "starting", "cpu-1"),
    ],
    ids=[
        "pending",
        "held",
        "scheduled",
        "ready",
        "draining",
        "warm",
        "warm-draining",
        "two-nodes",
        "cpu-only",
    ],
)
def test_replica_functions(page: Any, fleet: Fleet, replica: dict[str, Any], state: str, where: str) -> None:
    page.goto(fleet.server.url + "/")
    r = REPLICA | replica
    assert page.evaluate("r => [GF.replicaState(r), GF.replicaWhere(r)]", r) == [state, where]


@pytest.mark.parametrize(
    ("service", "want"),
    [
        ({"replicas_ready": 2, "replicas_desired": 2}, "ok"),
        ({"replicas_ready": 3, "replicas_desired": 2}, "ok"),
        ({"replicas_ready": 1, "replicas_desired": 2}, "partial"),
        ({"replicas_ready": 0, "replicas_desired": 2}, "down"),
        ({"replicas_ready": 0, "replicas_desired": 0}, "idle"),
        ({"replicas_ready": 1, "replicas_desired": 0, "state": "deleting"}, "deleting"),
    ],
    ids=["all-ready", "surge", "partial", "none-ready", "scaled-to-zero", "deleting"],
)
def test_service_health_function(page: Any, fleet: Fleet, service: dict[str, Any], want: str) -> None:
    page.goto(fleet.server.url + "/")
    assert page.evaluate("s => GF.serviceHealth(s)", {"state": "active"} | service) == want


TRAFFIC = {
    "qps": 12.345,
    "error_rate": 0.0,
    "p99_ms": 84.0,
    "p50_ms": 10.0,
    "inflight": 0,
    "window_s": 30,
    "gateways": 1,
}


@pytest.mark.parametrize(
    ("traffic", "slo", "want"),
    [
        (TRAFFIC, None,
         {"qps": "12.3 qps", "p99": "p99 84.0 ms", "slow": False, "errors": "0.0 % 5xx", "failing": False}),
        (TRAFFIC | {"qps": 1500.0, "p99_ms": 300.0, "error_rate": 0.25}, 250.0,
         {"qps": "1,500 qps", "p99": "p99 300 ms", "slow": True, "errors": "25 % 5xx", "failing": True}),
        (TRAFFIC | {"p99_ms": None, "error_rate": 0.01}, 250.0,
         {"qps": "12.3 qps", "p99": "p99 " + NONE, "slow": False, "errors": "1.0 % 5xx", "failing": False}),
        (None, 250.0, None),
    ],
    ids=["plain", "slow-and-failing", "no-latency-yet", "no-report"],
)  # fmt: skip
def test_traffic_text_function(
    page: Any, fleet: Fleet, traffic: dict[str, Any] | None, slo: float | None, want: dict[str, Any] | None
) -> None:
    page.goto(fleet.server.url + "/")
    assert page.evaluate("a => GF.trafficText(a[0], a[1])", [traffic, slo]) == want


@pytest.mark.parametrize(
    ("service", "want"),
    [
        ({"replicas_ready": 2, "replicas_desired": 3, "replicas_warm": 1}, "2 / 3 ready · 1 warm"),
        ({"replicas_ready": 2, "replicas_desired": 2, "replicas_warm": 0}, "2 / 2 ready"),
    ],
    ids=["warm", "no-warm"],
)
def test_ready_text_function(page: Any, fleet: Fleet, service: dict[str, Any], want: str) -> None:
    page.goto(fleet.server.url + "/")
    assert page.evaluate("s => GF.readyText(s)", service) == want


def test_the_card_shows_traffic_and_the_last_hour(page: Any, fleet: Fleet) -> None:
    srv = fleet.server
    deadline = time.monotonic() + 20
    with srv.client() as c:  # a sample every 5 s: wait for two, so the chart draws lines
        while len(ok(c.get("/fleet/services"))[1]["history"]["samples"]) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    sign_in(page, srv.url, "gf_test_admin_token")
    llama = page.locator("#services tbody tr").filter(has_text="llama")
    traffic = llama.locator(".svc-traffic")
    sync_api.expect(traffic.locator(".qps")).to_have_text(re.compile(r"^\d+(\.\d+)? qps$"))
    with srv.client() as c:
        t = ok(c.get("/services/llama"))["traffic"]
    assert t["qps"] > 0 and t["p99_ms"] is not None and t["error_rate"] == 0.01
    want = page.evaluate("t => GF.trafficText(t, null)", t)
    sync_api.expect(traffic.locator(".p99")).to_have_text(want["p99"])
    sync_api.expect(traffic.locator(".err")).to_have_text("1.0 % 5xx")
    alice = page.locator("#services tbody tr").filter(has_text="alice-svc")
    sync_api.expect(alice).to_contain_text("no traffic reported")
    chart = llama.locator("svg.svc-chart")
    sync_api.expect(chart).to_have_attribute(
        "aria-label", re.compile(r"now 2 desired, 0 ready, 0 warm, [\d.]+ qps")
    )
    lines = chart.locator("polyline")
    sync_api.expect(lines).to_have_count(4)
    page.locator("#services").scroll_into_view_if_needed()
    page.wait_for_timeout(200)
    page.locator(".svc-card").screenshot(path="/tmp/services-traffic.png")
