"""``GET /metrics`` and the fleet page's read endpoints, on an in-process server with two
nodes of telemetry, one placed job and one waiting job (``web/fleetapp.py``); the usage,
cost and reservation series with exact values on a small known database."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.server.metrics.collector import FleetCollector
from gpufleet.server.metrics.state import ServerMetrics
from gpufleet.server.runner import Loop
from gpufleet.server.services.dashboard import FleetView, ViewCache, load_spend, load_view
from gpufleet.server.store import db as dbmod
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import (
    Allocation,
    GpuRow,
    Job,
    NodeRow,
    PriceScheduleRow,
    ReservationRow,
    Team,
    UsageRow,
    User,
)
from server.conftest import scratch_postgres
from web.fleetapp import AUTH, Fleet, fleet


@pytest.fixture(scope="module")
def f(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with fleet(tmp_path_factory.mktemp("metrics")) as it:
        yield it


def _one(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    hits = [v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, samples.get(name))
    return hits[0]


@pytest.mark.parametrize(
    ("name", "node", "gpu", "want"),
    [
        ("DCGM_FI_DEV_GPU_UTIL", "node-a", "0", 97.5),
        ("DCGM_FI_DEV_FB_USED", "node-a", "0", 40_000),
        ("DCGM_FI_DEV_FB_FREE", "node-a", "0", 81_920 - 40_000),
        ("DCGM_FI_DEV_GPU_TEMP", "node-a", "0", 91.0),
        ("DCGM_FI_DEV_POWER_USAGE", "node-a", "0", 650.0),
        ("DCGM_FI_DEV_XID_ERRORS", "node-a", "1", 79),
        ("DCGM_FI_DEV_XID_ERRORS", "node-a", "0", 0),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "node-a", "2", 2),
        ("DCGM_FI_DEV_GPU_UTIL", "node-b", "3", 50.0),
    ],
    ids=["util", "fb-used", "fb-free", "temp", "power", "xid", "no-xid", "ecc-dbe", "other-node"],
)
def test_dcgm_series(f: Fleet, name: str, node: str, gpu: str, want: float) -> None:
    got = _one(f.scrape(), name, Hostname=node, gpu=gpu)
    assert got == want


def test_dcgm_labels_match_the_exporter(f: Fleet) -> None:
    samples = f.scrape()["DCGM_FI_DEV_GPU_TEMP"]
    assert len(samples) == 8
    labels, _ = next(s for s in samples if s[0]["Hostname"] == "node-a" and s[0]["gpu"] == "2")
    assert labels == {
        "gpu": "2",
        "UUID": "GPU-node-a-2",
        "device": "nvidia2",
        "modelName": "H100-80GB",
        "Hostname": "node-a",
    }


@pytest.mark.parametrize(
    ("name", "labels", "want"),
    [
        ("gpufleet_gpus", {"pool": "default"}, 8),
        ("gpufleet_gpus_allocated", {"pool": "default"}, 2),
        ("gpufleet_node_ready", {"node": "node-a"}, 1),
        ("gpufleet_node_cordoned", {"node": "node-b"}, 0),
        ("gpufleet_jobs", {"state": "PENDING"}, 1),
        ("gpufleet_jobs_pending", {"pool": "default"}, 1),
        ("gpufleet_team_gpus_allocated", {"team": "vision"}, 2),
        ("gpufleet_queue_wait_seconds_count", {"pool": "default"}, 1),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_fleet_series(f: Fleet, name: str, labels: dict[str, str], want: float) -> None:
    assert _one(f.scrape(), name, **labels) == want


def test_scheduler_and_api_series(f: Fleet) -> None:
    f.get(f"/v1/jobs/{f.job_id}")
    s = f.scrape()
    assert _one(s, "gpufleet_scheduling_pass_duration_seconds_count") >= 1
    assert _one(s, "gpufleet_scheduling_passes_total") >= 1
    assert 0.0 <= _one(s, "gpufleet_fragmentation_ratio") <= 1.0
    assert _one(s, "gpufleet_syncs_total") == 2
    assert {lab["quantile"] for lab, _ in s["gpufleet_sync_latency_seconds"]} == {"0.5", "0.99", "1"}
    # latency by route *template*: one series for every job id
    assert (
        _one(s, "gpufleet_http_request_duration_seconds_count", route="/v1/jobs/{job_id}", method="GET") >= 1
    )
    assert not [
        lab for lab, _ in s["gpufleet_http_request_duration_seconds_count"] if "/metrics" in lab["route"]
    ]
    assert _one(s, "gpufleet_queue_oldest_wait_seconds", pool="default") >= 0


def test_cost_and_reservation_series_on_the_running_server(f: Fleet) -> None:
    s = f.scrape()
    assert _one(s, "gpufleet_team_budget", team="vision", kind="hard") == 100.0
    assert _one(s, "gpufleet_team_cost_accrued", team="vision") >= 0.0
    assert [v for lab, v in s["gpufleet_reservation_gpus"] if lab["name"] == "demo-r"] == [1]


def test_snapshot_marks_hot_error_and_busy_gpus(f: Fleet) -> None:
    snap = f.get("/v1/fleet/snapshot")
    nodes = {n["name"]: n for n in snap["nodes"]}
    assert sorted(nodes) == ["node-a", "node-b"] and snap["hot_c"] == 85.0
    a = {g[0]: g for g in nodes["node-a"]["gpus"]}
    assert a[0][1:5] == [97.5, 91.0, 40_000, 81_920]
    assert a[0][5] & 1  # hot
    assert a[1][5] & 2 and a[2][5] & 2  # XID 79, double-bit ECC
    held = [g for n in nodes.values() for g in n["gpus"] if g[5] & 8]
    assert len(held) == 2 and {g[6] for g in held} == {f.job_id}


def test_node_history_and_jobs(f: Fleet) -> None:
    h = f.get("/v1/nodes/node-b/history")
    assert h["series"] == ["utilization_pct", "temperature_c", "power_w", "memory_used_mb"]
    assert len(h["samples"]) == 1 and h["samples"][0][1][3][0] == 50.0
    on_b = [j for j in h["jobs"] if j["id"] == f.job_id]
    on_a = [j for j in f.get("/v1/nodes/node-a/history")["jobs"] if j["id"] == f.job_id]
    assert len(on_a + on_b) == 1 and (on_a + on_b)[0]["team"] == "vision"


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/v1/fleet/snapshot", {}, 401),
        ("/v1/nodes/node-a/history", {}, 401),
        ("/v1/nodes/nope/history", AUTH, 404),
        ("/metrics", {}, 401),
        ("/metrics", AUTH, 200),
        ("/", {}, 200),
        ("/static/fleet.js", {}, 200),
    ],
    ids=[
        "snapshot-anon",
        "history-anon",
        "history-missing",
        "metrics-anon",
        "metrics-admin",
        "page",
        "static",
    ],
)
def test_access(f: Fleet, path: str, headers: dict[str, str], status: int) -> None:
    assert f.client.get(path, headers=headers).status_code == status


def test_page_is_self_contained(f: Fleet) -> None:
    html = f.client.get("/").text
    assert "http://" not in html and "https://" not in html  # no CDN
    for asset in ("/static/fleet.css", "/static/layout.js", "/static/fleet.js"):
        assert asset in html


def test_history_ring_keeps_one_sample_per_step(tmp_path: Path) -> None:
    from gpufleet.api.nodes import GpuTelemetry
    from gpufleet.server.store.telemetry import RecordingTelemetryStore

    store = RecordingTelemetryStore(step_s=5, keep=3)
    for at in (0, 1, 5, 9, 10, 15, 20):
        store.put(
            "n",
            at=at,
            gpus=[GpuTelemetry(index=0, utilization_pct=at)],
            driver_version=None,
            cuda_version=None,
        )
    assert [s.at for s in store.history("n")] == [10, 15, 20]
    assert store.get("n") is not None and store.get("n").at == 20  # type: ignore[union-attr]


# -- usage, cost and reservation series on a small known state ------------------------------

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC).timestamp()
LAST_MONTH_UTC = datetime(2026, 11, 30, 23, 0, tzinfo=UTC).timestamp()
"""December 1st 00:00 in Europe/Berlin: this month there, last month in UTC."""


@dataclass(frozen=True)
class Known:
    db: Database
    r1: int
    r2: int


def _known(url: str, zone: str | None) -> Known:
    """Teams vision (budget 4 / 5), speech (none), audio (hard 50, no usage); nodes n1,
    n2 of 4 GPUs; open reservations r1 (team vision: n1 x3, n2 x1) and r2 (user bob: n2
    x2), plus a future, a cancelled and a maintenance one (none exported).

    Jobs holding GPUs: J1 alice/vision n1[0,1], J2 alice/vision n2[0,1], J3 bob/speech
    n1[2], J4 bob/speech naming r1 n2[2], J5 bob/speech n2[3]. So r1 uses 2 on n1 (J1)
    and min(1, 2 + 1) on n2 (J2, J4): 3 of 4; J3 is no owner of r1 (speech), nor of r2
    (n1). r2: J5 (bob's) uses 1 of 2; J4 names r1, so it is no owner of r2."""
    dbmod.upgrade(url)
    db = Database.connect(url)
    with db.write() as s:
        if zone is not None:
            s.add(PriceScheduleRow(created_at=0, created_by="t", body={"timezone": zone, "base": {"*": 1.0}}))
        s.add_all(
            [
                User(id=1, name="alice", role="user", created_at=0),
                User(id=2, name="bob", role="user", created_at=0),
                Team(id=1, name="vision", budget_soft=4.0, budget_hard=5.0),
                Team(id=2, name="speech"),
                Team(id=3, name="audio", budget_hard=50.0),
            ]
        )
        for n in ("n1", "n2"):
            s.add(NodeRow(name=n, pool="default", created_at=0, last_seen=NOW))
            s.flush()
            s.add_all(GpuRow(node=n, index=i, model="H100", memory_mb=1) for i in range(4))
        s.flush()

        def resv(name: str, nodes: list[list[Any]], **kw: Any) -> int:
            base = {"team": None, "users": [], "maintenance": False, "state": "BOOKED", "start": NOW - 600}
            row = ReservationRow(
                **base | kw, name=name, owner_id=1, pool="default", gpus=sum(c for _, c in nodes),
                node_map=nodes, end=NOW + 3600, created_at=0,
            )  # fmt: skip
            s.add(row)
            s.flush()
            return row.id

        r1 = resv("train", [["n1", 3], ["n2", 1]], team="vision")
        r2 = resv("bob-only", [["n2", 2]], users=["bob"])
        resv("later", [["n1", 1]], team="vision", start=NOW + 60)
        resv("gone", [["n1", 1]], team="vision", state="CANCELLED")
        resv("fix", [["n2", 1]], maintenance=True)
        for jid, user, team, rid, node, idx in (
            (1, 1, 1, None, "n1", [0, 1]),
            (2, 1, 1, None, "n2", [0, 1]),
            (3, 2, 2, None, "n1", [2]),
            (4, 2, 2, r1, "n2", [2]),
            (5, 2, 2, None, "n2", [3]),
        ):
            s.add(
                Job(
                    id=jid, name="j", user_id=user, team_id=team, pool="default", gpus=len(idx),
                    command=["x"], env={}, state="RUNNING", submit_time=0, pending_since=0,
                    reservation_id=rid,
                )
            )  # fmt: skip
            s.flush()
            s.add_all(Allocation(job_id=jid, node=node, gpu_index=i) for i in idx)
        ledger = (  # job, team, hour, GPU-seconds, cost, Wh
            (1, 1, NOW - 7200, 7200.0, 3.5, 1400.0),
            (2, 1, NOW - 3600, 1800.0, 1.25, 300.0),
            (3, 2, LAST_MONTH_UTC, 3600.0, 100.0, 700.0),
        )
        s.add_all(
            UsageRow(job_id=j, team_id=tid, user_id=1, hour=h, pool="default", gpu_type="H100",
                     gpu_s=g, cost=c, energy_wh=wh)
            for j, tid, h, g, c, wh in ledger
        )  # fmt: skip
    return Known(db=db, r1=r1, r2=r2)


def _collect(view: FleetView, db: Database) -> dict[str, list[tuple[dict[str, str], float]]]:
    metrics = ServerMetrics()
    loop = Loop(name="scheduling", step=lambda: None, interval_s=1.0)
    metrics.registry.register(
        FleetCollector(view=lambda: view, hot=AgentState(), metrics=metrics, scheduler=loop)
    )
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for smp in fam.samples:
            out.setdefault(smp.name, []).append((dict(smp.labels), smp.value))
    return out


@pytest.fixture(
    params=[
        ("sqlite", None),
        ("sqlite", "Europe/Berlin"),
        ("postgresql", None),
        ("postgresql", "Europe/Berlin"),
    ],
    ids=["sqlite-utc", "sqlite-berlin", "postgresql-utc", "postgresql-berlin"],
)
def known(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Known, str | None]]:
    dialect, zone = request.param
    with contextlib.ExitStack() as stack:
        if dialect == "sqlite":
            url = f"sqlite:///{tmp_path / 'known.db'}"
        else:
            url = stack.enter_context(scratch_postgres("metrics"))
        k = _known(url, zone)
        yield k, zone
        k.db.dispose()


def test_team_usage_cost_and_budget_series(known: tuple[Known, str | None]) -> None:
    k, zone = known
    view = load_view(k.db, now=NOW, live_since=NOW - 30, spend=load_spend(k.db, now=NOW))
    s = _collect(view, k.db)
    berlin = zone == "Europe/Berlin"  # speech's only row is in the finance zone's month
    speech = (100.0, 1.0, 0.7) if berlin else (0.0, 0.0, 0.0)
    by_team = {name: {lab["team"]: v for lab, v in s[name]} for name in (
        "gpufleet_team_cost_accrued", "gpufleet_team_gpu_hours", "gpufleet_team_energy_kwh"
    )}  # fmt: skip
    assert by_team == {
        "gpufleet_team_cost_accrued": {"vision": 4.75, "speech": speech[0], "audio": 0.0},
        "gpufleet_team_gpu_hours": {"vision": 2.5, "speech": speech[1], "audio": 0.0},
        "gpufleet_team_energy_kwh": {"vision": 1.7, "speech": speech[2], "audio": 0.0},
    }
    budgets = sorted((lab["team"], lab["kind"], v) for lab, v in s["gpufleet_team_budget"])
    assert budgets == [("audio", "hard", 50.0), ("vision", "hard", 5.0), ("vision", "soft", 4.0)]


def test_reservation_utilisation_series(known: tuple[Known, str | None]) -> None:
    k, _ = known
    s = _collect(load_view(k.db, now=NOW, live_since=NOW - 30), k.db)
    got = {
        name: sorted((lab["reservation"], lab["name"], lab["team"], lab["pool"], v) for lab, v in s[name])
        for name in ("gpufleet_reservation_gpus", "gpufleet_reservation_used_gpus")
    }
    r1, r2 = str(k.r1), str(k.r2)
    assert got == {
        "gpufleet_reservation_gpus": [
            (r1, "train", "vision", "default", 4),
            (r2, "bob-only", "", "default", 2),
        ],
        "gpufleet_reservation_used_gpus": [
            (r1, "train", "vision", "default", 3),
            (r2, "bob-only", "", "default", 1),
        ],
    }


def test_spend_is_cached_longer_than_the_view(known: tuple[Known, str | None]) -> None:
    k, _ = known
    views = ViewCache(ttl_s=0.0, spend_ttl_s=3600.0)
    before = {t.team: t.cost for t in views.get(k.db, now=NOW, live_since=NOW).spend}
    with k.db.write() as s:
        s.add(UsageRow(job_id=9, team_id=3, user_id=1, hour=NOW, pool="default", gpu_type="H100", cost=7.0))
    again = views.get(k.db, now=NOW, live_since=NOW)
    assert {t.team: t.cost for t in again.spend} == before and before["audio"] == 0.0
    fresh = ViewCache(ttl_s=0.0, spend_ttl_s=0.0).get(k.db, now=NOW, live_since=NOW)
    assert {t.team: t.cost for t in fresh.spend}["audio"] == 7.0
