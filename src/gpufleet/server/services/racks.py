"""Rack power budgets (issue 34): admins declare a rack's feed and the share kept free
(``PUT /racks/{rack}``) and figures over the scheduler's power defaults
(``PUT /power-figures``); everyone reads each rack's estimated draw against its budget.

The scheduler enforces the budgets (``gpufleet.scheduler.power``): ``power_model`` is
what the scheduling pass's snapshot carries. The draw shown here is the core's own
estimate (``scheduler.power.estimate_draw``) over the same fleet, allocations and
readings, so what an operator reads is what the scheduler counts.

Measured power: the pass runs in a child process that has only the database, while
agents' telemetry lives in the API process that received their syncs. That process
writes each node's per-GPU readings into its row (``nodes.gpu_power``, with
``gpu_power_at``) in the heartbeat flush, only when one moved or aged
(``store/gpupower.py``: ``write_gpu_power`` is the writer's bulk op); ``power_model``
reads them back with the budgets. A reading older than ``READING_MAX_AGE_S`` is
ignored (the node stopped reporting): its GPUs count at board power again. The core
uses a busy GPU's reading only once its job has run ``PowerModel.settle_s``.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from gpufleet import mig
from gpufleet.api.racks import PowerFigureIn, PowerFigureList, PowerFigureOut, RackIn, RackList, RackOut
from gpufleet.mig import SLICE_BASE
from gpufleet.scheduler import Fleet, JobRequest, NodeGpus, RunningJob, Snapshot
from gpufleet.scheduler.power import estimate_draw
from gpufleet.scheduler.powermodel import PowerModel, RackBudget
from gpufleet.server.defaults import NODE_TIMEOUT_S
from gpufleet.server.jobstate.states import ACTIVE
from gpufleet.server.problems import Failure, forbidden, not_found
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.inventory import LiveFleet
from gpufleet.server.store.db import Database
from gpufleet.server.store.gpupower import MAX_GPU_W, PowerBatch
from gpufleet.server.store.models import Allocation, Job, NodeRow, PowerFigureRow, RackPowerRow

READING_MAX_AGE_S = 120.0
"""A node's readings older than this are not counted (twice the flush's refresh, so a
node that reports keeps them; one that stopped falls back to board power)."""


def power_model(s: Session, now: float, *, racks_too: Sequence[str] = ()) -> PowerModel | None:
    """The racks' budgets, the operators' figures and the readings of the budgeted
    racks' nodes (and ``racks_too``'s) that are at most ``READING_MAX_AGE_S`` old at
    ``now`` (None: no rack has a budget)."""
    racks = tuple(
        RackBudget(rack=r.rack, budget_w=r.budget_w, headroom=r.headroom)
        for r in s.scalars(select(RackPowerRow).order_by(RackPowerRow.rack))
    )
    if not racks and not racks_too:
        return None
    figures = list(s.scalars(select(PowerFigureRow).order_by(PowerFigureRow.kind, PowerFigureRow.name)))
    return PowerModel(
        racks=racks,
        board_w=tuple((f.name, f.board_w) for f in figures if f.kind == "model" and f.board_w is not None),
        node_board_w=tuple(
            (f.name, f.board_w) for f in figures if f.kind == "node" and f.board_w is not None
        ),
        node_base_w=tuple((f.name, f.base_w) for f in figures if f.kind == "node" and f.base_w is not None),
        measured=measured(s, now, {r.rack for r in racks} | set(racks_too)),
    )


def measured(s: Session, now: float, racks: set[str]) -> tuple[tuple[str, int, float], ...]:
    """(node, GPU index, watts) of the nodes in ``racks`` whose readings are recent. A
    row's malformed entry is skipped (the row is the API process's, but one bad item
    never fails a pass)."""
    q = (
        select(NodeRow.name, NodeRow.gpu_power)
        .where(NodeRow.rack.in_(sorted(racks)), NodeRow.gpu_power_at >= now - READING_MAX_AGE_S)
        .order_by(NodeRow.name)
    )
    out: list[tuple[str, int, float]] = []
    for node, watts in s.execute(q):
        if not isinstance(watts, dict):
            continue
        for key, w in watts.items():
            try:
                index, value = int(key), float(w)
            except (TypeError, ValueError):
                continue
            if 0.0 <= value <= MAX_GPU_W:  # (NaN fails both)
                out.append((node, index, value))
    return tuple(out)


def write_gpu_power(s: Session, batches: Sequence[PowerBatch]) -> list[None]:
    """A ``BulkOp``: the nodes' readings in one executemany, never replacing newer ones
    (another server's, under HA)."""
    latest: PowerBatch = {}
    for batch in batches:
        for node, reading in batch.items():
            have = latest.get(node)
            if have is None or reading.at > have.at:
                latest[node] = reading
    if latest:
        stmt = (
            update(NodeRow)
            .where(NodeRow.name == bindparam("n"))
            .where(NodeRow.gpu_power_at.is_(None) | (NodeRow.gpu_power_at < bindparam("t")))
            .values(gpu_power=bindparam("w"), gpu_power_at=bindparam("t"))
        )
        rows = [
            {"n": n, "t": r.at, "w": {str(i): w for i, w in sorted(r.watts.items())}}
            for n, r in sorted(latest.items())
        ]
        s.connection().execute(stmt, rows)
    return [None] * len(batches)


def rack_draws(s: Session, now: float, *, also: str | None = None) -> tuple[list[RackOut], Fleet]:
    """Every rack the server knows (of a node or a budget; and ``also``), with its
    estimated draw."""
    live = LiveFleet(quiet=True)  # the scheduling loop's reader says which nodes are left out
    fleet = live.load(s, live_since=now - NODE_TIMEOUT_S)
    running = _running(s, live.slices, now)
    rows = {r.rack: r for r in s.scalars(select(RackPowerRow))}
    racks = sorted(
        set(s.scalars(select(NodeRow.rack).distinct())) | rows.keys() | ({also} if also else set())
    )
    model = power_model(s, now, racks_too=racks)
    draws = estimate_draw(Snapshot(now=now, fleet=fleet, running=running, power=model), racks)
    nodes: dict[str, int] = {}
    # physical GPUs, each once: a MIG GPU's slices and a shared GPU's units are parts of
    # one GPU (the scheduler sees them as nodes of their own, "node-007:1g.10gb")
    gpus: dict[str, set[tuple[str, int]]] = {}
    busy: dict[str, set[tuple[str, int]]] = {}
    rack_of = {n.name: n.rack for n in fleet.nodes}
    for n in fleet.nodes:
        host = mig.physical_node(n.name)
        if host == n.name:
            nodes[n.rack] = nodes.get(n.rack, 0) + 1
        gpus.setdefault(n.rack, set()).update((host, mig.device_gpu(g.index)) for g in n.gpus)
    for rj in running:
        for part in rj.placement:
            rack = rack_of.get(part.node)
            if rack is not None:
                host = mig.physical_node(part.node)
                busy.setdefault(rack, set()).update((host, mig.device_gpu(g)) for g in part.gpus)
    out = []
    for rack in racks:
        row = rows.get(rack)
        out.append(
            RackOut(
                rack=rack,
                nodes=nodes.get(rack, 0),
                gpus=len(gpus.get(rack, ())),
                busy_gpus=len(busy.get(rack, ())),
                draw_kw=round(draws.get(rack, 0.0) / 1000, 3),
                power_kw=None if row is None else row.budget_w / 1000,
                headroom=None if row is None else row.headroom,
                cap_kw=None if row is None else round(row.budget_w * (1 - row.headroom) / 1000, 3),
                updated_by=None if row is None else row.updated_by,
                updated_at=None if row is None else row.updated_at,
            )
        )
    return out, fleet


def _running(s: Session, slices: dict[tuple[str, int], str], now: float) -> tuple[RunningJob, ...]:
    """Running and scheduled jobs with their devices, on the core's nodes (as the
    scheduling pass reads them: a MIG slice or GPU share on its slice or share node)."""
    parts: dict[int, dict[str, list[int]]] = {}
    started: dict[int, float] = {}
    q = (
        select(Allocation.job_id, Allocation.node, Allocation.gpu_index, Job.started_at, Job.scheduled_at)
        .join(Job, Job.id == Allocation.job_id)
        .where(Job.state.in_([str(a) for a in ACTIVE]), Allocation.gpu_index.is_not(None))
    )
    for jid, node, idx, started_at, scheduled_at in s.execute(q):
        if idx is None:
            continue
        started[jid] = started_at or scheduled_at or now  # as the pass's snapshot reads it
        if idx >= SLICE_BASE:
            share = mig.share_of(idx)
            node = (
                mig.share_node(node, share[0])
                if share
                else slices.get((node, idx), mig.slice_node(node, "?"))
            )
        parts.setdefault(jid, {}).setdefault(node, []).append(idx)
    return tuple(
        RunningJob(
            job=_placeholder(jid, held),
            placement=tuple(NodeGpus(node=n, gpus=tuple(sorted(g))) for n, g in sorted(held.items())),
            started_at=started[jid],
        )
        for jid, held in sorted(parts.items())
    )


def _placeholder(jid: int, held: dict[str, list[int]]) -> JobRequest:
    """What the estimate needs of a running job: its devices (its placement says where)."""
    return JobRequest(id=str(jid), gpus=sum(len(g) for g in held.values()), submit_time=0.0)


def list_racks(*, db: Database, actor: Principal, now: float) -> RackList:
    with db.read() as s:
        return RackList(items=rack_draws(s, now)[0])


def _rack(s: Session, rack: str, now: float) -> RackOut:
    return next(r for r in rack_draws(s, now, also=rack)[0] if r.rack == rack)


def set_rack(*, db: Database, actor: Principal, rack: str, spec: RackIn, now: float) -> RackOut | Failure:
    if not actor.is_admin:
        return forbidden("only admins set rack power budgets")
    with db.write() as s:
        row = s.get(RackPowerRow, rack)
        if row is None:
            row = RackPowerRow(rack=rack)
            s.add(row)
        row.budget_w = spec.power_kw * 1000
        row.headroom = spec.headroom
        row.updated_at = now
        row.updated_by = actor.name
        s.flush()
        return _rack(s, rack, now)


def unset_rack(*, db: Database, actor: Principal, rack: str, now: float) -> RackOut | Failure:
    if not actor.is_admin:
        return forbidden("only admins set rack power budgets")
    with db.write() as s:
        row = s.get(RackPowerRow, rack)
        if row is None:
            return not_found(f"rack {rack} has no power budget")
        s.delete(row)
        s.flush()
        return _rack(s, rack, now)


def _figure(row: PowerFigureRow) -> PowerFigureOut:
    return PowerFigureOut(kind=row.kind, name=row.name, board_w=row.board_w, base_w=row.base_w)


def list_figures(*, db: Database, actor: Principal) -> PowerFigureList:
    with db.read() as s:
        rows = s.scalars(select(PowerFigureRow).order_by(PowerFigureRow.kind, PowerFigureRow.name))
        return PowerFigureList(items=[_figure(r) for r in rows])


def set_figure(*, db: Database, actor: Principal, spec: PowerFigureIn) -> PowerFigureOut | Failure:
    if not actor.is_admin:
        return forbidden("only admins set power figures")
    with db.write() as s:
        row = s.get(PowerFigureRow, (spec.kind, spec.name))
        if row is None:
            row = PowerFigureRow(kind=spec.kind, name=spec.name)
            s.add(row)
        if spec.board_w is not None:
            row.board_w = spec.board_w
        if spec.base_w is not None:
            row.base_w = spec.base_w
        s.flush()
        return _figure(row)


def unset_figure(*, db: Database, actor: Principal, kind: str, name: str) -> PowerFigureOut | Failure:
    if not actor.is_admin:
        return forbidden("only admins set power figures")
    with db.write() as s:
        row = s.get(PowerFigureRow, (kind, name))
        if row is None:
            return not_found(f"no power figure for {kind} {name}")
        out = _figure(row)
        s.delete(row)
        return out
