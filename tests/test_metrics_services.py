"""The ``gpufleet_service_*`` series: exact values from a collector over a known view
(services, their replicas' GPUs, telemetry, two gateways' reports, prices), and the
same series on a running server after a gateway report (``web/fleetapp.py``); the
services' history ring."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.api.nodes import GpuTelemetry
from gpufleet.api.services import LatencyIn, ServiceCounters, ServiceTraffic
from gpufleet.server.decide.pricing import PriceSchedule
from gpufleet.server.metrics.collector import FleetCollector
from gpufleet.server.metrics.state import ServerMetrics
from gpufleet.server.runner import Loop
from gpufleet.server.services.dashboard import FleetView, GpuInfo, NodeInfo
from gpufleet.server.services.fleetservices import ReplicaInfo, ServiceHistory, ServiceInfo
from gpufleet.server.store.agentstate import AgentState
from web.fleetapp import Fleet, fleet

NOW = 1_000_000.0
Samples = dict[str, list[tuple[dict[str, str], float]]]


def replica(job_id: int, gpus: tuple[int, ...] = (), **kw: Any) -> ReplicaInfo:
    base: dict[str, Any] = {"replica": job_id, "generation": 1, "state": "RUNNING", "ready": True}
    base |= {"draining": False, "endpoint": None, "placement": (("n1", gpus),) if gpus else ()}
    return ReplicaInfo(job_id=job_id, **base | kw)


def service(name: str, replicas: tuple[ReplicaInfo, ...] = (), **kw: Any) -> ServiceInfo:
    base: dict[str, Any] = {"owner_id": 1, "owner": "alice", "team": "t", "protocol": "http"}
    base |= {"generation": 1, "state": "active", "desired": 2}
    return ServiceInfo(name=name, replicas=replicas, **base | kw)


CHAT = service(
    "chat",
    (
        replica(1, (0, 1)),  # serving
        replica(2, (2,), warm=True),  # a warm standby: power and price, not utilisation
        replica(3, state="PENDING", ready=False),  # waiting for GPUs
    ),
    desired=3,
    max_replicas=3,
    slo_p99_ms=250.0,
)
QUIET = service("quiet", (replica(4, (3,), ready=False, state="SCHEDULED"),), desired=1)
"""not autoscaled, no SLO, not reported by any gateway, its replica still starting"""
TELEMETRY = [  # GPU, util %, W
    GpuTelemetry(index=0, utilization_pct=80.0, power_w=300.0),
    GpuTelemetry(index=1, utilization_pct=60.0, power_w=200.0),
    GpuTelemetry(index=2, utilization_pct=5.0, power_w=100.0),
    GpuTelemetry(index=3, utilization_pct=0.0, power_w=60.0),
]


def counters(ok: int, errors: int, *, fast: int, inflight: int) -> ServiceCounters:
    total = ok + errors
    latency = LatencyIn(le=[0.1, 1e9], counts=[fast, total], sum=0.0, count=total)
    return ServiceCounters(codes={"200": ok, "503": errors}, inflight=inflight, latency=latency)


def hot_state() -> AgentState:
    """Gateway g1: 1,000 answers in 10 s (100 QPS), 10 of them 503; g2: one report so far
    (its counters add to the totals, not yet to a rate)."""
    hot = AgentState()
    hot.telemetry.put("n1", at=NOW, gpus=TELEMETRY, driver_version=None, cuda_version=None)
    hot.traffic.put("g1", NOW - 10, {"chat": counters(1000, 0, fast=950, inflight=1)})
    hot.traffic.put("g1", NOW, {"chat": counters(1990, 10, fast=1900, inflight=4)})
    hot.traffic.put("g2", NOW, {"chat": counters(50, 0, fast=40, inflight=2)})
    return hot


def collect(*, prices: PriceSchedule | None = None, team_costs: bool = True) -> Samples:
    view = FleetView(
        at=NOW,
        nodes=(NodeInfo(name="n1", pool="p", leaf="l", rack="r", cordoned=False, ready=True),),
        gpus=tuple(
            GpuInfo(node="n1", index=i, uuid=f"GPU-{i}", model="H100", memory_mb=80_000, healthy=True)
            for i in range(4)
        ),
        held={},
        jobs={},
        queues=(),
        services=(CHAT, QUIET),
        prices=prices,
    )
    metrics = ServerMetrics()
    loop = Loop(name="scheduling", step=lambda: None, interval_s=1.0)
    collector = FleetCollector(
        view=lambda: view, hot=hot_state(), metrics=metrics, scheduler=loop, team_costs=team_costs
    )
    metrics.registry.register(collector)
    out: Samples = {}
    for fam in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for smp in fam.samples:
            if smp.name.startswith("gpufleet_service_"):
                out.setdefault(smp.name, []).append((dict(smp.labels), smp.value))
    return out


PRICES = PriceSchedule(base={"H100": 2.0}, warm=0.5)
PER_HOUR = 2 * 2.0 + 1 * 2.0 * 0.5  # two serving GPUs, one warm at half price


@pytest.mark.parametrize(
    ("name", "labels", "want"),
    [
        ("gpufleet_service_requests_total", {"service": "chat", "code": "200"}, 1990 + 50),
        ("gpufleet_service_requests_total", {"service": "chat", "code": "503"}, 10),
        ("gpufleet_service_request_seconds_bucket", {"service": "chat", "le": "0.1"}, 1900 + 40),
        ("gpufleet_service_request_seconds_bucket", {"service": "chat", "le": "+Inf"}, 2000 + 50),
        ("gpufleet_service_request_seconds_count", {"service": "chat"}, 2050),
        ("gpufleet_service_inflight", {"service": "chat"}, 4 + 2),
        ("gpufleet_service_replicas", {"service": "chat", "state": "desired"}, 3),
        ("gpufleet_service_replicas", {"service": "chat", "state": "ready"}, 1),
        ("gpufleet_service_replicas", {"service": "chat", "state": "warm"}, 1),
        ("gpufleet_service_replicas", {"service": "quiet", "state": "ready"}, 0),
        ("gpufleet_service_replicas_max", {"service": "chat"}, 3),
        ("gpufleet_service_slo_p99_seconds", {"service": "chat"}, 0.25),
        ("gpufleet_service_gpu_utilization", {"service": "chat"}, 70.0),
        ("gpufleet_service_power_watts", {"service": "chat"}, 600.0),
        ("gpufleet_service_power_watts", {"service": "quiet"}, 60.0),
        ("gpufleet_service_energy_wh_per_1k", {"service": "chat"}, 600.0 / 100 * 1000 / 3600),
        ("gpufleet_service_cost_per_1k", {"service": "chat"}, PER_HOUR / (100 * 3600) * 1000),
    ],
    ids=[
        "ok-summed", "errors", "bucket", "bucket-inf", "count", "inflight", "desired", "ready", "warm",
        "starting-not-ready", "max", "slo", "util-serving-only", "power-all-replicas", "power-starting",
        "energy", "cost",
    ],
)  # fmt: skip
def test_series(name: str, labels: dict[str, str], want: float) -> None:
    got = [v for lab, v in collect(prices=PRICES).get(name, []) if labels.items() <= lab.items()]
    assert got == [pytest.approx(want)]
    assert all(lab["team"] == "t" for lab, _ in collect(prices=PRICES)[name])


@pytest.mark.parametrize(
    "name",
    [
        "gpufleet_service_replicas_max",  # not autoscaled
        "gpufleet_service_slo_p99_seconds",  # no SLO
        "gpufleet_service_gpu_utilization",  # no serving replica
        "gpufleet_service_requests_total",  # no gateway report
        "gpufleet_service_request_seconds_bucket",
        "gpufleet_service_inflight",
        "gpufleet_service_energy_wh_per_1k",  # no QPS
        "gpufleet_service_cost_per_1k",
    ],
    ids=["max", "slo", "util", "requests", "latency", "inflight", "energy", "cost"],
)
def test_what_a_quiet_service_has_not(name: str) -> None:
    got = collect(prices=PRICES)[name]
    assert got and not [lab for lab, _ in got if lab["service"] == "quiet"]


@pytest.mark.parametrize(
    ("prices", "team_costs"),
    [(None, True), (PRICES, False)],
    ids=["no-prices", "no-team-cost-metrics"],
)
def test_no_cost_series_without_prices_or_with_team_costs_off(
    prices: PriceSchedule | None, team_costs: bool
) -> None:
    got = collect(prices=prices, team_costs=team_costs)
    assert "gpufleet_service_cost_per_1k" not in got
    assert "gpufleet_service_energy_wh_per_1k" in got


def test_no_sum_is_made_up() -> None:
    assert "gpufleet_service_request_seconds_sum" not in collect()


# -- history ---------------------------------------------------------------------------------


def stats(qps: float) -> ServiceTraffic:
    return ServiceTraffic(
        window_s=30, qps=qps, error_rate=0, inflight=0, p50_ms=None, p99_ms=None, gateways=1
    )


def test_history_keeps_one_sample_per_step_for_an_hour_and_forgets_gone_services() -> None:
    h = ServiceHistory(step_s=5, keep_s=15)
    traffic = {"chat": stats(12.5)}
    taken = [h.sample((CHAT, QUIET), traffic.get, at) for at in (0, 1, 4.9, 5, 10, 15)]
    assert taken == [True, False, False, True, True, True]
    assert h.samples("chat") == [(5, 3, 1, 1, 12.5), (10, 3, 1, 1, 12.5), (15, 3, 1, 1, 12.5)]
    assert [s[4] for s in h.samples("quiet")] == [None, None, None]
    h.sample((CHAT,), traffic.get, 20)
    assert h.samples("quiet") == []


# -- on a running server ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with fleet(tmp_path_factory.mktemp("services"), service=True) as f:
        yield f


def _one(samples: Samples, name: str, **labels: str) -> float:
    hits = [v for lab, v in samples.get(name, []) if labels.items() <= lab.items()]
    assert len(hits) == 1, (name, labels, samples.get(name))
    return hits[0]


def test_series_after_a_gateway_report(served: Fleet) -> None:
    s = served.scrape()
    key = {"service": "chat", "team": "vision"}
    assert _one(s, "gpufleet_service_requests_total", code="200", **key) == 396
    assert _one(s, "gpufleet_service_requests_total", code="503", **key) == 4
    assert _one(s, "gpufleet_service_request_seconds_bucket", le="0.05", **key) == 240
    assert _one(s, "gpufleet_service_request_seconds_count", **key) == 400
    assert _one(s, "gpufleet_service_inflight", **key) == 3
    assert [_one(s, "gpufleet_service_replicas", state=x, **key) for x in ("desired", "ready", "warm")] == [
        1,
        1,
        0,
    ]
    assert _one(s, "gpufleet_service_replicas_max", **key) == 3
    assert _one(s, "gpufleet_service_slo_p99_seconds", **key) == 0.25
    # its replica's GPU is one of node-b's (each at 50 %, 70 W in web/fleetapp.py)
    assert _one(s, "gpufleet_service_gpu_utilization", **key) == 50.0
    assert _one(s, "gpufleet_service_power_watts", **key) == 70.0
    assert _one(s, "gpufleet_service_energy_wh_per_1k", **key) > 0
    assert _one(s, "gpufleet_service_cost_per_1k", **key) > 0


def test_fleet_services_has_traffic_and_history(served: Fleet, tmp_path: Path) -> None:
    (chat,) = served.get("/v1/fleet/services")
    assert (chat["replicas_desired"], chat["replicas_ready"], chat["replicas_warm"]) == (1, 1, 0)
    assert chat["slo_p99_ms"] == 250.0
    t = chat["traffic"]
    assert t["qps"] > 0 and t["error_rate"] == 0.01 and t["inflight"] == 3 and t["p99_ms"] is not None
    h = chat["history"]
    assert h["series"] == ["desired", "ready", "warm", "qps"] and h["step_s"] == 5.0
    assert len(h["samples"]) >= 1 and h["samples"][-1][1:4] == [1, 1, 0]
