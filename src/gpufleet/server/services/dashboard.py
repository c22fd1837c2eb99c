"""Read models for the fleet page, ``/metrics`` and the built-in alerts: one cheap pass
over nodes, GPUs, allocations and job counts (``FleetView``), cached for a second so a
page poll, a Prometheus scrape and an alert evaluation in the same second share it.

Also the page's small read endpoints: the compact fleet snapshot (a few numbers per GPU,
~40 bytes each, so 4,000 GPUs stay ~200 kB), one node's telemetry history and jobs, and
GPU-hours per team.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from sqlalchemy import func, literal, select

from gpufleet.server.db import Database
from gpufleet.server.hot import HotState
from gpufleet.server.metrics.history import FATAL_XIDS, RecordingTelemetryStore
from gpufleet.server.models import Allocation, GpuRow, Job, NodeRow, Team, User
from gpufleet.server.problems import Failure, not_found
from gpufleet.server.schemas import GpuTelemetry
from gpufleet.server.services.accounts import Principal
from gpufleet.server.states import JobState
from gpufleet.server.web.schemas import (
    FleetSnapshot,
    NodeHistory,
    NodeJob,
    SnapshotNode,
    TeamUsage,
    UsageReport,
)

HOT_C = 85.0
"""A GPU at or above this temperature is *hot* (page marker and the GpuHot alert)."""

# Bits of a GPU's flags in the snapshot (the page's tile markers).
HOT, ERROR, CORDONED, BUSY = 1, 2, 4, 8


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    name: str
    pool: str
    leaf: str
    rack: str
    cordoned: bool
    ready: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInfo:
    node: str
    index: int
    uuid: str
    model: str
    memory_mb: int
    healthy: bool
    cordoned: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueStat:
    pool: str
    pending: int
    oldest_since: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetView:
    at: float
    nodes: tuple[NodeInfo, ...]
    gpus: tuple[GpuInfo, ...]
    held: dict[tuple[str, int], int]
    """(node, GPU index) -> job id holding it"""
    jobs: dict[str, int]
    """jobs by state"""
    queues: tuple[QueueStat, ...]
    team_gpus: dict[str, int] = field(default_factory=dict)
    """GPUs held by each team's running jobs"""


def load_view(db: Database, *, now: float, live_since: float) -> FleetView:
    with db.read() as s:
        nodes = tuple(
            NodeInfo(
                name=n,
                pool=p,
                leaf=lf,
                rack=r,
                cordoned=bool(c),
                ready=seen is not None and seen >= live_since,
            )
            for n, p, lf, r, c, seen in s.execute(
                select(
                    NodeRow.name,
                    NodeRow.pool,
                    NodeRow.leaf,
                    NodeRow.rack,
                    NodeRow.cordoned,
                    NodeRow.last_seen,
                ).order_by(NodeRow.name)
            )
        )
        # Per-GPU cordons come with node maintenance (``gpus.cordoned``); without that
        # column every GPU counts as uncordoned.
        gcord = getattr(GpuRow, "cordoned", None)
        gq = select(
            GpuRow.node,
            GpuRow.index,
            GpuRow.uuid,
            GpuRow.model,
            GpuRow.memory_mb,
            GpuRow.healthy,
            gcord if gcord is not None else literal(False),
        ).order_by(GpuRow.node, GpuRow.index)
        gpus = tuple(
            GpuInfo(node=n, index=i, uuid=u, model=m, memory_mb=mb, healthy=bool(h), cordoned=bool(c))
            for n, i, u, m, mb, h, c in s.execute(gq)
        )
        held = {
            (n, int(i)): j
            for n, i, j in s.execute(
                select(Allocation.node, Allocation.gpu_index, Allocation.job_id).where(
                    Allocation.gpu_index.is_not(None)
                )
            )
            if i is not None
        }
        jobs: dict[str, int] = {}
        queues: list[QueueStat] = []
        q = select(Job.pool, Job.state, func.count(), func.min(Job.pending_since)).group_by(
            Job.pool, Job.state
        )
        for pool, state, n, oldest in s.execute(q):
            jobs[state] = jobs.get(state, 0) + int(n)
            if state == JobState.PENDING:
                queues.append(QueueStat(pool=pool, pending=int(n), oldest_since=oldest))
        tq = (
            select(Team.name, func.sum(Job.gpus))
            .join(Job, Job.team_id == Team.id)
            .where(Job.state.in_([str(JobState.SCHEDULED), str(JobState.RUNNING)]))
            .group_by(Team.name)
        )
        team_gpus = {t: int(n or 0) for t, n in s.execute(tq)}
    return FleetView(
        at=now,
        nodes=nodes,
        gpus=gpus,
        held=held,
        jobs=dict(sorted(jobs.items())),
        queues=tuple(sorted(queues, key=lambda x: x.pool)),
        team_gpus=team_gpus,
    )


@dataclass(slots=True)
class ViewCache:
    ttl_s: float = 1.0
    _hit: tuple[float, FleetView] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, db: Database, *, now: float, live_since: float) -> FleetView:
        with self._lock:
            hit = self._hit
            if hit is not None and hit[0] > time.monotonic():
                return hit[1]
            view = load_view(db, now=now, live_since=live_since)
            self._hit = (time.monotonic() + self.ttl_s, view)
            return view


# -- the page's endpoints ---------------------------------------------------------------------


def gpu_flags(*, gpu: GpuInfo, node: NodeInfo, hot: HotState, busy: bool) -> int:
    tel = hot.telemetry.get(gpu.node)
    t = tel.gpus.get(gpu.index) if tel is not None else None
    flags = BUSY if busy else 0
    if node.cordoned or gpu.cordoned:
        flags |= CORDONED
    if t is not None and t.temperature_c is not None and t.temperature_c >= HOT_C:
        flags |= HOT
    if not gpu.healthy or (t is not None and _faulty(t)):
        flags |= ERROR
    return flags


def _faulty(t: GpuTelemetry) -> bool:
    """What the agent reports as wrong right now: lost, its own health messages, a fatal
    XID in this sample, double-bit ECC errors."""
    return t.lost or bool(t.health) or bool(FATAL_XIDS & set(t.xid_events)) or (t.ecc_dbe or 0) > 0


def snapshot(view: FleetView, hot: HotState) -> FleetSnapshot:
    """Per GPU: [index, util %, temp C, memory used MiB, memory MiB, flags, job id]."""
    per: dict[str, list[GpuInfo]] = {}
    for g in view.gpus:
        per.setdefault(g.node, []).append(g)
    out: list[SnapshotNode] = []
    for n in view.nodes:
        tel = hot.telemetry.get(n.name)
        rows: list[list[float | int | None]] = []
        for g in per.get(n.name, []):
            t = tel.gpus.get(g.index) if tel is not None else None
            job = view.held.get((n.name, g.index))
            rows.append(
                [
                    g.index,
                    None if t is None else t.utilization_pct,
                    None if t is None else t.temperature_c,
                    None if t is None else t.memory_used_mb,
                    g.memory_mb,
                    gpu_flags(gpu=g, node=n, hot=hot, busy=job is not None),
                    job,
                ]
            )
        model = per[n.name][0].model if per.get(n.name) else ""
        out.append(
            SnapshotNode(
                name=n.name,
                pool=n.pool,
                leaf=n.leaf,
                rack=n.rack,
                ready=n.ready,
                cordoned=n.cordoned,
                model=model,
                gpus=rows,
            )
        )
    return FleetSnapshot(at=view.at, hot_c=HOT_C, jobs=view.jobs, nodes=out)


def node_history(
    *, db: Database, hot: HotState, actor: Principal, name: str, now: float
) -> NodeHistory | Failure:
    """A node's recent telemetry and the jobs on it. Like ``GET /v1/jobs``, a plain user
    sees the details of their own jobs only (others: id and GPU count)."""
    with db.read() as s:
        if s.get(NodeRow, name) is None:
            return not_found(f"no node {name}")
        q = (
            select(Job, User.name, Team.name, Allocation.gpu_index)
            .join(Allocation, Allocation.job_id == Job.id)
            .join(User, User.id == Job.user_id)
            .join(Team, Team.id == Job.team_id)
            .where(Allocation.node == name)
            .order_by(Job.id, Allocation.gpu_index)
        )
        jobs: dict[int, NodeJob] = {}
        for job, user, team, idx in s.execute(q):
            mine = actor.is_operator or job.user_id == actor.user_id
            prev = jobs.get(job.id)
            gpus = ([*prev.gpus_here] if prev else []) + ([idx] if idx is not None else [])
            jobs[job.id] = NodeJob(
                id=job.id,
                name=job.name if mine else "",
                user=user if mine else "",
                team=team if mine else "",
                state=job.state,
                gpus=job.gpus,
                gpus_here=gpus,
                started_at=job.started_at,
            )
    store = hot.telemetry
    samples = store.history(name) if isinstance(store, RecordingTelemetryStore) else []
    return NodeHistory(
        node=name,
        now=now,
        series=["utilization_pct", "temperature_c", "power_w", "memory_used_mb"],
        samples=[[x.at, [list(g) for g in x.gpus]] for x in samples],
        jobs=list(jobs.values()),
    )


def usage(*, db: Database, now: float) -> UsageReport:
    """GPU-hours per team: finished attempts (``attained_service_s``, GPU-seconds) plus
    what running jobs have used so far. Cost per team comes with pricing (a later issue)."""
    with db.read() as s:
        done = dict(
            s.execute(
                select(Team.name, func.sum(Job.attained_service_s))
                .join(Job, Job.team_id == Team.id)
                .group_by(Team.name)
            ).all()
        )
        running: dict[str, float] = {}
        q = (
            select(Team.name, Job.gpus, Job.started_at)
            .join(Job, Job.team_id == Team.id)
            .where(Job.state == str(JobState.RUNNING), Job.started_at.is_not(None))
        )
        for team, gpus, started in s.execute(q):
            running[team] = running.get(team, 0.0) + gpus * max(0.0, now - (started or now))
        teams = [str(t) for t in s.scalars(select(Team.name).order_by(Team.name))]
    rows = [
        TeamUsage(team=t, gpu_hours=round(((done.get(t) or 0.0) + running.get(t, 0.0)) / 3600, 3))
        for t in teams
    ]
    return UsageReport(at=now, teams=sorted(rows, key=lambda r: -r.gpu_hours), cost_available=False)
