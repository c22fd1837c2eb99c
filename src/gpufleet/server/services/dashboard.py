"""Read models for the fleet page, ``/metrics`` and the built-in alerts: one cheap pass
over nodes, GPUs, allocations, job counts and open reservations (``FleetView``), cached
for a second so a page poll, a Prometheus scrape and an alert evaluation in the same
second share it. Each team's month so far (``TeamSpend``: a sum over the ledger) rides
along, cached for ``ViewCache.spend_ttl_s``: the ledger only moves at accrual ticks.

Also the page's small read endpoints: the compact fleet snapshot (a few numbers per GPU,
~40 bytes each, so 4,000 GPUs stay ~200 kB), one node's telemetry history and jobs, and
GPU-hours per team. The inference services (two queries in the view, whatever their
number; their page JSON and history) are ``fleetservices.py``'s.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet.api.fleet import FleetSnapshot, NodeHistory, NodeJob, SnapshotNode, Suspicion
from gpufleet.api.nodes import GpuTelemetry
from gpufleet.api.racks import RackOut
from gpufleet.diagnosis import Signature
from gpufleet.migindex import SHARE_UNITS, device_gpu, share_of, slice_index, slice_of, wants_share
from gpufleet.scheduler import JobRequest
from gpufleet.server.decide.pricing import PriceSchedule
from gpufleet.server.decide.suspicion import DiagnosisConfig
from gpufleet.server.decide.traffic import TrafficStore
from gpufleet.server.jobstate.states import JobState
from gpufleet.server.problems import Failure, not_found
from gpufleet.server.services import diagnosisview, racks
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.fleetservices import ServiceHistory, ServiceInfo, load_services
from gpufleet.server.services.reservations import BOOKED, to_core
from gpufleet.server.store import ledger
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import (
    Allocation,
    GpuRow,
    Job,
    NodeRow,
    ReservationRow,
    Team,
    UsageRow,
    User,
)
from gpufleet.server.store.telemetry import FATAL_XIDS, RecordingTelemetryStore

HOT_C = 85.0
"""A GPU at or above this temperature is *hot* (page marker and the GpuHot alert)."""

# Bits of a GPU's flags in the snapshot (the page's tile markers).
HOT, ERROR, CORDONED, BUSY, SHARED = 1, 2, 4, 8, 16


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    name: str
    pool: str
    leaf: str
    rack: str
    cordoned: bool
    ready: bool
    cordon_reason: str | None = None
    warning: str | None = None


MigSlice = tuple[str, int, int]
"""A MIG instance on the page: (profile, first memory slice 0..7, memory slices 1..8)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuInfo:
    node: str
    index: int
    uuid: str
    model: str
    memory_mb: int
    healthy: bool
    cordoned: bool = False
    cordon_reason: str | None = None
    mig: tuple[MigSlice, ...] | None = None
    """In MIG mode: its instances, by first memory slice (None: not in MIG mode)."""
    mig_pending: tuple[str, ...] | None = None
    """A MIG layout asked for and not yet applied, by profile (empty: the whole GPU, MIG off)."""
    mig_devices: tuple[MigDevice, ...] = ()
    """Its MIG instances as ``/metrics`` labels them: (UUID, profile, GPU instance id, slice index)."""
    shared: bool = False
    """An operator marked it shared: it takes GPU shares (``migindex.SHARE_UNITS`` units)."""


MigDevice = tuple[str, str, int, int]


def mig_devices(index: int, instances: object) -> tuple[MigDevice, ...]:
    """``GpuRow.mig_instances`` of GPU ``index`` as ``MigDevice``s (a malformed entry is
    left out: it came from an agent, and one bad item never stops the page or /metrics)."""
    out: list[MigDevice] = []
    for x in instances if isinstance(instances, list) else ():
        if not isinstance(x, dict):
            continue
        gi, start = x.get("gpu_instance_id"), x.get("start")
        if isinstance(gi, int) and isinstance(start, int) and 0 <= start < 8:
            out.append(
                (str(x.get("uuid") or ""), str(x.get("profile") or "?"), gi, slice_index(index, start))
            )
    return tuple(sorted(out, key=lambda d: d[3]))


def mig_slices(instances: object) -> tuple[MigSlice, ...]:
    """``GpuRow.mig_instances`` (the agent's report, stored as JSON) as ``MigSlice``s by
    first memory slice; an entry without a placement (start, size) is left out."""
    out: list[MigSlice] = []
    for x in instances if isinstance(instances, list) else ():
        if isinstance(x, dict) and isinstance(x.get("start"), int) and isinstance(x.get("size"), int):
            out.append((str(x.get("profile") or "?"), int(x["start"]), int(x["size"])))
    return tuple(sorted(out, key=lambda m: (m[1], m[2])))


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueStat:
    pool: str
    pending: int
    oldest_since: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TeamSpend:
    """A team's calendar month so far in the finance time zone, from the ledger (so up to
    the last accrual tick; the window of ``ledger.month_spend``, which holds jobs),
    and its monthly budget. Cost is in the price schedule's unit (0 without prices)."""

    team: str
    cost: float
    gpu_hours: float
    energy_kwh: float
    budget_soft: float | None = None
    budget_hard: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ReservationUse:
    """A BOOKED reservation whose window ``[start, end)`` holds the view's time; not a
    maintenance one (it owns no jobs: nothing to use).

    ``gpus``: the GPUs it reserves (its node map). ``used``: how many of them its owner
    jobs hold (SCHEDULED or RUNNING; owners as ``Reservation.owns``: jobs naming it, else
    jobs of its users or team), counted per node and capped at what it reserves on that
    node, since an owner job on a reserved node runs on the reservation's GPUs. An owner
    job of two open reservations on one node counts towards both."""

    id: int
    name: str
    team: str
    pool: str
    gpus: int
    used: int


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
    team_gpus: dict[str, float] = field(default_factory=dict)
    """GPUs held by each team's running jobs (a GPU share as its part of a GPU, as quotas
    count it: units / ``SHARE_UNITS``)"""
    reservations: tuple[ReservationUse, ...] = ()
    spend: tuple[TeamSpend, ...] = ()
    """every team, by name"""
    services: tuple[ServiceInfo, ...] = ()
    """every service, by name (``fleetservices.services_for`` keeps a user to their own)"""
    prices: PriceSchedule | None = None
    """the price schedule in force (None: no prices), refreshed with ``spend``"""
    held_slices: dict[tuple[str, int], int] = field(default_factory=dict)
    """(node, MIG slice index) -> job id holding that slice"""
    held_units: dict[tuple[str, int], int] = field(default_factory=dict)
    """(node, shared GPU index) -> share units its jobs hold (a GPU without any: absent)"""
    racks: tuple[RackOut, ...] = ()
    """every rack, its estimated draw and power budget (``services/racks.py``)"""
    suspects: dict[str, Suspicion] = field(default_factory=dict)
    """node -> why failure diagnosis suspects it (suspect nodes only: ``diagnosisview``)"""


def load_view(
    db: Database,
    *,
    now: float,
    live_since: float,
    spend: tuple[TeamSpend, ...] = (),
    prices: PriceSchedule | None = None,
    diagnosis: DiagnosisConfig | None = None,
) -> FleetView:
    """``spend`` and ``prices`` come from ``load_spend`` (on its own, slower, cache);
    ``diagnosis``: the server's table and suspicion rule (None: the defaults)."""
    with db.read() as s:
        nodes = tuple(
            NodeInfo(
                name=n,
                pool=p,
                leaf=lf,
                rack=r,
                cordoned=bool(c),
                ready=seen is not None and seen >= live_since,
                cordon_reason=why if c else None,
                warning=warning,
            )
            for n, p, lf, r, c, why, seen, warning in s.execute(
                select(
                    NodeRow.name,
                    NodeRow.pool,
                    NodeRow.leaf,
                    NodeRow.rack,
                    NodeRow.cordoned,
                    NodeRow.cordon_reason,
                    NodeRow.last_seen,
                    NodeRow.warning,
                ).order_by(NodeRow.name)
            )
        )
        gq = select(
            GpuRow.node,
            GpuRow.index,
            GpuRow.uuid,
            GpuRow.model,
            GpuRow.memory_mb,
            GpuRow.healthy,
            GpuRow.cordoned,
            GpuRow.cordon_reason,
            GpuRow.mig_enabled,
            GpuRow.mig_instances,
            GpuRow.mig_pending,
            GpuRow.shared,
        ).order_by(GpuRow.node, GpuRow.index)
        gpus = tuple(
            GpuInfo(
                node=n,
                index=i,
                uuid=u,
                model=m,
                memory_mb=mb,
                healthy=bool(h),
                cordoned=bool(c),
                cordon_reason=why if c else None,
                mig=mig_slices(inst) if mig else None,
                mig_pending=None if pend is None else tuple(str(p) for p in pend),
                mig_devices=mig_devices(i, inst) if mig else (),
                shared=bool(shared),
            )
            for n, i, u, m, mb, h, c, why, mig, inst, pend, shared in s.execute(gq)
        )
        allocated = [
            (n, int(i), j)
            for n, i, j in s.execute(
                select(Allocation.node, Allocation.gpu_index, Allocation.job_id).where(
                    Allocation.gpu_index.is_not(None)
                )
            )
            if i is not None
        ]
        held = {(n, device_gpu(i)): j for n, i, j in allocated}  # a slice's or share's job shows on its GPU
        held_slices = {(n, i): j for n, i, j in allocated if slice_of(i) is not None}
        held_units: dict[tuple[str, int], int] = {}
        for node, i, _ in allocated:
            unit = share_of(i)
            if unit is not None:
                held_units[(node, unit[0])] = held_units.get((node, unit[0]), 0) + 1
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
            select(Team.name, Job.gpu_type, func.sum(Job.gpus))
            .join(Job, Job.team_id == Team.id)
            .where(Job.state.in_([str(JobState.SCHEDULED), str(JobState.RUNNING)]))
            .group_by(Team.name, Job.gpu_type)
        )
        team_gpus: dict[str, float] = {}
        for t, gpu_type, n in s.execute(tq):  # a share job's ``gpus`` are its units
            per_gpu = SHARE_UNITS if wants_share(gpu_type) else 1
            team_gpus[t] = team_gpus.get(t, 0.0) + int(n or 0) / per_gpu
        reservations = load_reservations(s, now=now, held=held)
        services = load_services(s)
        power = tuple(racks.rack_draws(s, now)[0])
        suspects = diagnosisview.suspicions(
            s, now=now, config=diagnosis or DiagnosisConfig(), cordoned=[n.name for n in nodes if n.cordoned]
        )
    return FleetView(
        at=now,
        nodes=nodes,
        gpus=gpus,
        held=held,
        held_slices=held_slices,
        held_units=held_units,
        jobs=dict(sorted(jobs.items())),
        queues=tuple(sorted(queues, key=lambda x: x.pool)),
        team_gpus=team_gpus,
        reservations=reservations,
        spend=spend,
        services=services,
        prices=prices,
        racks=power,
        suspects=suspects,
    )


def load_reservations(
    s: Session, *, now: float, held: Mapping[tuple[str, int], int]
) -> tuple[ReservationUse, ...]:
    """``ReservationUse`` of the open reservations; ``held``: (node, GPU index) -> job id."""
    rows = list(
        s.scalars(
            select(ReservationRow)
            .where(
                ReservationRow.state == BOOKED,
                ReservationRow.start <= now,
                ReservationRow.end > now,
                ReservationRow.maintenance.is_(False),
            )
            .order_by(ReservationRow.id)
        )
    )
    if not rows:
        return ()
    nodes = {str(n) for r in rows for n, _ in r.node_map}
    on: dict[int, dict[str, int]] = {}  # job -> node -> GPUs it holds there
    for (node, _), jid in held.items():
        if node in nodes:
            per = on.setdefault(jid, {})
            per[node] = per.get(node, 0) + 1
    jobs: dict[int, JobRequest] = {}
    if on:
        q = (
            select(Job.id, User.name, Team.name, Job.reservation_id)
            .join(User, User.id == Job.user_id)
            .join(Team, Team.id == Job.team_id)
            .where(Job.id.in_(list(on)))
        )
        for jid, user, team, rid in s.execute(q):
            res = None if rid is None else str(rid)
            jobs[jid] = JobRequest(
                id=str(jid), gpus=0, submit_time=0.0, user=user, team=team, reservation=res
            )
    out: list[ReservationUse] = []
    for r in rows:
        core = to_core(r)
        owners = [on[jid] for jid, job in jobs.items() if core.owns(job)]
        used = sum(min(n, sum(per.get(node, 0) for per in owners)) for node, n in core.nodes)
        out.append(
            ReservationUse(id=r.id, name=r.name, team=r.team or "", pool=r.pool, gpus=core.gpus, used=used)
        )
    return tuple(out)


def load_spend(db: Database, *, now: float) -> tuple[TeamSpend, ...]:
    """Every team's ``TeamSpend``: one grouped sum over this month's ledger rows."""
    with db.read() as s:
        month = ledger.month_start(now, ledger.finance_zone(s))
        since = math.floor(month / ledger.HOUR) * ledger.HOUR
        q = (
            select(
                UsageRow.team_id,
                func.sum(UsageRow.cost),
                func.sum(UsageRow.gpu_s),
                func.sum(UsageRow.energy_wh),
            )
            .where(UsageRow.hour >= since)
            .group_by(UsageRow.team_id)
        )
        sums = {tid: (float(c or 0), float(g or 0), float(e or 0)) for tid, c, g, e in s.execute(q)}
        teams = s.execute(select(Team.id, Team.name, Team.budget_soft, Team.budget_hard).order_by(Team.name))
        out = []
        for tid, name, soft, hard in teams:
            cost, gpu_s, wh = sums.get(tid, (0.0, 0.0, 0.0))
            out.append(
                TeamSpend(
                    team=name,
                    cost=cost,
                    gpu_hours=gpu_s / ledger.HOUR,
                    energy_kwh=wh / 1000.0,
                    budget_soft=soft,
                    budget_hard=hard,
                )
            )
    return tuple(out)


def load_prices(db: Database) -> PriceSchedule | None:
    with db.read() as s:
        found = ledger.schedule_in_force(s)
    return None if found is None else found[0]


@dataclass(slots=True)
class ViewCache:
    """``traffic``: the gateways' reports; with it, each rebuilt view also samples the
    services' history (``history``, at most every ``history.step_s``)."""

    ttl_s: float = 1.0
    spend_ttl_s: float = 10.0
    traffic: TrafficStore | None = None
    history: ServiceHistory = field(default_factory=ServiceHistory)
    diagnosis: DiagnosisConfig | None = None
    _hit: tuple[float, FleetView] | None = None
    _spend: tuple[float, tuple[TeamSpend, ...], PriceSchedule | None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, db: Database, *, now: float, live_since: float) -> FleetView:
        with self._lock:
            hit = self._hit
            if hit is not None and hit[0] > time.monotonic():
                return hit[1]
            if self._spend is None or self._spend[0] <= time.monotonic():
                self._spend = (time.monotonic() + self.spend_ttl_s, load_spend(db, now=now), load_prices(db))
            _, spend, prices = self._spend
            view = load_view(
                db, now=now, live_since=live_since, spend=spend, prices=prices, diagnosis=self.diagnosis
            )
            self._hit = (time.monotonic() + self.ttl_s, view)
            store = self.traffic
            if store is not None:
                self.history.sample(view.services, lambda name: store.stats(name, now), now)
            return view


# -- the page's endpoints ---------------------------------------------------------------------


def gpu_flags(*, gpu: GpuInfo, node: NodeInfo, hot: AgentState, busy: bool) -> int:
    tel = hot.telemetry.get(gpu.node)
    t = tel.gpus.get(gpu.index) if tel is not None else None
    flags = (BUSY if busy else 0) | (SHARED if gpu.shared else 0)
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


def snapshot(view: FleetView, hot: AgentState) -> FleetSnapshot:
    """Per GPU: [index, util %, temp C, memory used MiB, memory MiB, flags, job id], and
    for a shared GPU (flag ``SHARED``) an eighth number: the % of it its jobs hold (the
    job id is then one of them). The cordon reasons ride along (the node's, and each GPU
    cordoned on its own), so the page's node panel explains a hatched tile from the same
    read as the heatmap; so do the MIG instances and pending layouts of the GPUs that
    have them (a node without any carries neither: ``SnapshotNode`` leaves empty ones out
    of the JSON)."""
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
            row: list[float | int | None] = [
                g.index,
                None if t is None else t.utilization_pct,
                None if t is None else t.temperature_c,
                None if t is None else t.memory_used_mb,
                g.memory_mb,
                gpu_flags(gpu=g, node=n, hot=hot, busy=job is not None),
                job,
            ]
            if g.shared:
                row.append(round(100 * view.held_units.get((n.name, g.index), 0) / SHARE_UNITS))
            rows.append(row)
        model = per[n.name][0].model if per.get(n.name) else ""
        cordons = {g.index: g.cordon_reason or "" for g in per.get(n.name, []) if g.cordoned}
        mig = {g.index: list(g.mig) for g in per.get(n.name, []) if g.mig is not None}
        pending = {
            g.index: ",".join(g.mig_pending) or "whole"
            for g in per.get(n.name, [])
            if g.mig_pending is not None
        }
        out.append(
            SnapshotNode(
                name=n.name,
                pool=n.pool,
                leaf=n.leaf,
                rack=n.rack,
                ready=n.ready,
                cordoned=n.cordoned,
                cordon_reason=(n.cordon_reason or "") if n.cordoned else None,
                warning=n.warning,
                cordoned_gpus=cordons,
                model=model,
                gpus=rows,
                mig=mig,
                mig_pending=pending,
                suspect=view.suspects.get(n.name),
            )
        )
    return FleetSnapshot(at=view.at, hot_c=HOT_C, jobs=view.jobs, nodes=out)


def node_history(
    *,
    db: Database,
    hot: AgentState,
    actor: Principal,
    name: str,
    now: float,
    signatures: Sequence[Signature] = (),
) -> NodeHistory | Failure:
    """A node's recent telemetry, the jobs on it and its last failed job attempts with
    their diagnosis (``signatures``: the table that explains them). Like ``GET /v1/jobs``,
    a plain user sees the details of their own jobs only (others: id and GPU count)."""
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
        failures = diagnosisview.node_failures(s, node=name, actor=actor, signatures=signatures)
    store = hot.telemetry
    samples = store.history(name) if isinstance(store, RecordingTelemetryStore) else []
    return NodeHistory(
        node=name,
        now=now,
        series=["utilization_pct", "temperature_c", "power_w", "memory_used_mb"],
        samples=[[x.at, [list(g) for g in x.gpus]] for x in samples],
        jobs=list(jobs.values()),
        failures=failures,
    )
