"""``GET /metrics`` and the fleet page's read endpoints, on an in-process server with two
nodes of telemetry, one placed job and one waiting job (``web/fleetapp.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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


def test_reservation_and_cost_series_are_absent_until_they_exist(f: Fleet) -> None:
    names = set(f.scrape())
    assert not [n for n in names if "reservation" in n or "cost" in n or "budget" in n]


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
        ("/v1/fleet/usage", {}, 401),
        ("/metrics", {}, 200),
        ("/", {}, 200),
        ("/static/fleet.js", {}, 200),
    ],
    ids=["snapshot-anon", "history-anon", "history-missing", "usage-anon", "metrics-open", "page", "static"],
)
def test_access(f: Fleet, path: str, headers: dict[str, str], status: int) -> None:
    assert f.client.get(path, headers=headers).status_code == status


def test_usage_lists_teams(f: Fleet) -> None:
    u = f.get("/v1/fleet/usage")
    assert u["cost_available"] is False
    assert {t["team"] for t in u["teams"]} >= {"vision"}


def test_page_is_self_contained(f: Fleet) -> None:
    html = f.client.get("/").text
    assert "http://" not in html and "https://" not in html  # no CDN
    for asset in ("/static/fleet.css", "/static/layout.js", "/static/fleet.js"):
        assert asset in html


def test_history_ring_keeps_one_sample_per_step(tmp_path: Path) -> None:
    from gpufleet.server.metrics.history import RecordingTelemetryStore
    from gpufleet.server.schemas import GpuTelemetry

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
