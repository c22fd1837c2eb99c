"""MIG instances and GPU shares in ``/metrics`` and in usage reports, on a small known
SQLite database (``load_view`` and the collector, in process).

Node n1: GPU 0 in MIG mode, cut in 3g.40gb (GPU instance 1, at memory slice 0: job 1
holds it) and 1g.10gb (GPU instance 2, at 4: free); GPU 1 shared, jobs 2 and 3 holding
50 and 25 of its units; GPU 2 whole, job 4 on it. The agent's telemetry has GPU 0 at
350 W with the memory of instance 1 only (its agent read no more), GPU 1 at 200 W."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.api.chargeback import UsageReport
from gpufleet.api.nodes import GpuTelemetry, MigTelemetry
from gpufleet.migindex import share_index, slice_index
from gpufleet.server.decide.pricing import parse_prices
from gpufleet.server.metrics.collector import FleetCollector
from gpufleet.server.metrics.state import ServerMetrics
from gpufleet.server.runner import Loop
from gpufleet.server.services import chargeback
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.dashboard import load_view
from gpufleet.server.store import db as dbmod
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.db import Database
from gpufleet.server.store.ledger import HOUR, Sample, _Open, measure
from gpufleet.server.store.models import Allocation, GpuRow, Job, NodeRow, Team, UsageRow, User

NOW = 1_800_000_000.0
MODEL = "NVIDIA H100 80GB HBM3"
MIB = 1024 * 1024
Samples = dict[str, list[tuple[dict[str, str], float]]]
# job id -> (GPU type it asked for, the model it runs on, its allocated indices on n1)
JOBS: dict[int, tuple[str | None, str, list[int]]] = {
    1: ("MIG 3g.40gb", f"{MODEL} MIG 3g.40gb", [slice_index(0, 0)]),
    2: ("SHARED", f"{MODEL} SHARED", [share_index(1, u) for u in range(50)]),
    3: ("SHARED", f"{MODEL} SHARED", [share_index(1, u) for u in range(50, 75)]),
    4: (None, MODEL, [2]),
}


def _instance(profile: str, gi: int, start: int, size: int) -> dict[str, object]:
    return {
        "uuid": f"MIG-n1-0-{gi}", "profile": profile, "gpu_instance_id": gi, "compute_instance_id": 0,
        "start": start, "size": size, "memory_mb": size * 10_176,
    }  # fmt: skip


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    url = f"sqlite:///{tmp_path_factory.mktemp('shares') / 'shares.db'}"
    dbmod.upgrade(url)
    db = Database.connect(url)
    with db.write() as s:
        s.add_all([User(id=1, name="alice", role="user", created_at=0), Team(id=1, name="vision")])
        s.add(NodeRow(name="n1", pool="default", created_at=0, last_seen=NOW))
        s.flush()
        mig = [_instance("3g.40gb", 1, 0, 4), _instance("1g.10gb", 2, 4, 1)]
        s.add_all(
            [
                GpuRow(node="n1", index=0, uuid="GPU-0", model=MODEL, memory_mb=81_559, mig_enabled=True,
                       mig_instances=mig),
                GpuRow(node="n1", index=1, uuid="GPU-1", model=MODEL, memory_mb=81_559, shared=True),
                GpuRow(node="n1", index=2, uuid="GPU-2", model=MODEL, memory_mb=81_559),
            ]
        )  # fmt: skip
        for jid, (gpu_type, _, idx) in JOBS.items():
            s.add(
                Job(id=jid, name="j", user_id=1, team_id=1, pool="default", gpus=len(idx), gpu_type=gpu_type,
                    command=["x"], env={}, state="RUNNING", submit_time=0, pending_since=0)
            )  # fmt: skip
            s.flush()
            s.add_all(Allocation(job_id=jid, node="n1", gpu_index=i) for i in idx)
    yield db
    db.dispose()


@pytest.fixture(scope="module")
def samples(db: Database) -> Samples:
    """One scrape (the usage test adds ledger rows, which no series here reads)."""
    hot = AgentState()
    hot.telemetry.put(
        "n1",
        at=NOW,
        gpus=[
            GpuTelemetry(
                index=0,
                power_w=350.0,
                mig_instances=[MigTelemetry(gpu_instance_id=1, memory_used_mb=1_000, memory_total_mb=40_704)],
            ),
            GpuTelemetry(index=1, utilization_pct=60.0, power_w=200.0),
            GpuTelemetry(index=2, power_w=100.0),
        ],
        driver_version=None,
        cuda_version=None,
    )
    view = load_view(db, now=NOW, live_since=NOW - 60)
    metrics = ServerMetrics()
    loop = Loop(name="scheduling", step=lambda: None, interval_s=1.0)
    metrics.registry.register(FleetCollector(view=lambda: view, hot=hot, metrics=metrics, scheduler=loop))
    out: Samples = {}
    for fam in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for smp in fam.samples:
            out.setdefault(smp.name, []).append((dict(smp.labels), smp.value))
    return out


def _only(samples: Samples, name: str, **labels: str) -> float | None:
    hits = [v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(hits) <= 1, (name, labels, hits)
    return hits[0] if hits else None


def test_mig_instance_series_carry_dcgm_and_instance_labels(samples: Samples) -> None:
    labels, value = next(x for x in samples["gpufleet_mig_instance_memory_used_bytes"])
    assert labels == {
        "gpu": "0", "UUID": "GPU-0", "device": "nvidia0", "modelName": MODEL, "Hostname": "n1",
        "GPU_I_ID": "1", "GPU_I_PROFILE": "3g.40gb", "mig_uuid": "MIG-n1-0-1",
    }  # fmt: skip
    assert value == 1_000 * MIB


@pytest.mark.parametrize(
    ("name", "gi", "want"),
    [
        ("gpufleet_mig_instance_memory_used_bytes", "1", 1_000 * MIB),
        ("gpufleet_mig_instance_memory_total_bytes", "1", 40_704 * MIB),
        ("gpufleet_mig_instance_memory_used_bytes", "2", None),  # no reading: no series
        ("gpufleet_mig_instance_memory_total_bytes", "2", None),
        ("gpufleet_mig_instance_power_watts", "1", 350.0 * 3 / 7),  # compute slices / 7 of the GPU's
        ("gpufleet_mig_instance_power_watts", "2", 350.0 * 1 / 7),
        ("gpufleet_mig_instance_allocated", "1", 1.0),
        ("gpufleet_mig_instance_allocated", "2", 0.0),
    ],
    ids=["used", "total", "no-used", "no-total", "power-3g", "power-1g", "held", "free"],
)
def test_mig_instance_series(samples: Samples, name: str, gi: str, want: float | None) -> None:
    got = _only(samples, name, Hostname="n1", gpu="0", GPU_I_ID=gi)
    assert got == (None if want is None else pytest.approx(want))


@pytest.mark.parametrize(
    ("name", "gpu", "want"),
    [
        ("gpufleet_gpu_shared", "1", 1.0),
        ("gpufleet_gpu_share_allocated_ratio", "1", 0.75),  # 50 + 25 units of 100
        ("gpufleet_gpu_shared", "0", None),  # MIG and whole GPUs have no share series
        ("gpufleet_gpu_shared", "2", None),
        ("gpufleet_gpu_share_allocated_ratio", "2", None),
        ("gpufleet_team_gpus_allocated", None, 1 + 0.75 + 1),  # a slice 1, the shares 0.75, a GPU 1
        ("gpufleet_gpus_allocated", None, 3),  # every GPU something holds
    ],
    ids=["shared", "ratio", "mig-gpu", "whole-gpu", "whole-ratio", "team-gpus", "gpus-allocated"],
)
def test_share_series(samples: Samples, name: str, gpu: str | None, want: float | None) -> None:
    labels = {"Hostname": "n1", "gpu": gpu} if gpu is not None else {}
    got = _only(samples, name, **labels)
    assert got == (None if want is None else pytest.approx(want))


def test_share_series_labels(samples: Samples) -> None:
    ((labels, _),) = samples["gpufleet_gpu_share_allocated_ratio"]
    assert labels == {"gpu": "1", "UUID": "GPU-1", "device": "nvidia1", "modelName": MODEL, "Hostname": "n1"}


def test_usage_by_gpu_type_shows_each_profile_and_shares_apart(db: Database) -> None:
    """The ledger keeps a slice's and a share's model in its usage rows, so ``gpufleet usage
    --by gpu-type`` has a row per MIG profile and one for shares, billed by their part."""
    schedule = parse_prices({"timezone": "UTC", "base": {"*": 7.0}})
    start = (NOW // HOUR - 1) * HOUR

    def readings(node: str, index: int) -> Sample | None:
        return Sample(util_pct=50.0, power_w=700.0)

    with db.write() as s:
        for jid, (_, model, idx) in JOBS.items():
            job = _Open(
                id=jid, accrued_to=start, gpus=len(idx), priority=0, model=model, user_id=1, team_id=1,
                pool="default",
            )  # fmt: skip
            rows = measure(
                job, start + HOUR, gpus_at=[("n1", i) for i in idx], schedule=schedule, readings=readings
            )
            s.add_all(UsageRow(**row) for row in rows)
    admin = Principal(user_id=1, name="alice", role="admin")
    report = chargeback.usage(db=db, actor=admin, by="gpu-type", month=None, start=None, end=None, now=NOW)
    assert isinstance(report, UsageReport), report
    got = {r.key: (r.jobs, r.gpu_hours, r.cost) for r in report.rows}
    assert got == {
        MODEL: (1, 1.0, 7.0),
        f"{MODEL} MIG 3g.40gb": (1, round(3 / 7, 4), pytest.approx(3.0)),
        f"{MODEL} SHARED": (2, 0.75, pytest.approx(0.75 * 7.0)),
    }
