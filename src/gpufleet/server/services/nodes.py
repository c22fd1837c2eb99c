"""Nodes: list/show for everyone, register/update and sync for operators.

Sync, the agent protocol, lives in ``services/sync.py``. Registration (``PUT``) counts
as a sighting of the node, like a sync. The latest telemetry an agent sent (hot data,
``AgentState``) is shown with each GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import bindparam, delete, select, update
from sqlalchemy.orm import Session

from gpufleet.api.base import MAX_GPU_INDEX
from gpufleet.api.nodes import GpuIn, GpuOut, MigInstanceOut, NodeLabels, NodeOut, NodePut
from gpufleet.mig import device_gpu
from gpufleet.server.problems import Failure, conflict, forbidden, invalid, not_found
from gpufleet.server.services.auth import Principal
from gpufleet.server.store import effects
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import Allocation, GpuRow, NodeRow, Pool
from gpufleet.server.store.pages import NodePage, cut


def _node_out(s: Session, n: NodeRow, live_since: float, hot: AgentState | None = None) -> NodeOut:
    gpus = list(s.scalars(select(GpuRow).where(GpuRow.node == n.name).order_by(GpuRow.index)))
    held = {  # a MIG slice's or a share's job shows on its GPU
        device_gpu(i): j
        for i, j in s.execute(
            select(Allocation.gpu_index, Allocation.job_id).where(
                Allocation.node == n.name, Allocation.gpu_index.is_not(None)
            )
        ).all()
        if i is not None
    }
    ready = n.last_seen is not None and n.last_seen >= live_since
    tel = hot.telemetry.get(n.name) if hot is not None else None
    return NodeOut(
        name=n.name,
        pool=n.pool,
        leaf=n.leaf,
        rack=n.rack,
        state="Ready" if ready else "NotReady",
        cordoned=n.cordoned,
        last_seen=n.last_seen,
        model=gpus[0].model if gpus else "",
        gpus_total=len(gpus),
        gpus_used=len(held),
        gpus_free=sum(
            1
            for g in gpus
            if g.healthy and not g.cordoned and not g.mig_enabled and not g.shared and g.index not in held
        ),  # a MIG or shared GPU is never free whole
        gpus=[
            GpuOut(
                index=g.index,
                uuid=g.uuid,
                model=g.model,
                memory_mb=g.memory_mb,
                nvlink_domain=g.nvlink_domain,
                healthy=g.healthy,
                job_id=held.get(g.index),
                telemetry=tel.gpus.get(g.index) if tel is not None else None,
                cordoned=g.cordoned,
                cordon_reason=g.cordon_reason,
                mig_enabled=g.mig_enabled,
                mig_instances=[MigInstanceOut(**m) for m in g.mig_instances or ()],
                mig_pending=g.mig_pending,
                mig_error=g.mig_error,
                shared=bool(g.shared),
            )
            for g in gpus
        ],
        address=n.address,
        warning=n.warning,
        driver_version=tel.driver_version if tel is not None else None,
        cuda_version=tel.cuda_version if tel is not None else None,
        telemetry_at=tel.at if tel is not None else None,
        cordon_reason=n.cordon_reason,
        lost=n.lost_at is not None,
        draining=n.drain_deadline is not None,
        drain_deadline=n.drain_deadline,
        gpus_cordoned=sum(1 for g in gpus if g.cordoned),
        cpus=n.cpus or 0,
        memory_mb=n.memory_mb or 0,
        features=list(n.features or ()),
        labels=list(n.labels or ()),
    )


def list_nodes(
    *,
    db: Database,
    actor: Principal,
    live_since: float,
    pool: str | None = None,
    hot: AgentState | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> NodePage:
    """By name, a page at a time (``pages.py``)."""
    with db.read() as s:
        q = select(NodeRow).order_by(NodeRow.name).limit(limit + 1)
        if pool is not None:
            q = q.where(NodeRow.pool == pool)
        if cursor is not None:
            q = q.where(NodeRow.name > cursor)
        rows, after = cut(list(s.scalars(q)), limit, lambda n: n.name)
        return NodePage(items=[_node_out(s, n, live_since, hot) for n in rows], next_cursor=after)


def show_node(
    *, db: Database, actor: Principal, name: str, live_since: float, hot: AgentState | None = None
) -> NodeOut | Failure:
    with db.read() as s:
        n = s.get(NodeRow, name)
        return not_found(f"no node {name}") if n is None else _node_out(s, n, live_since, hot)


@dataclass(frozen=True, slots=True, kw_only=True)
class Contradiction:
    """Why a node's GPU inventory cannot be taken as sent. ``under_job``: it contradicts
    a job that holds one of the GPUs (else the inventory contradicts itself)."""

    reason: str
    under_job: bool = False


def judge_inventory(
    gpus: Sequence[GpuIn], *, stored: Mapping[int, str], held: Mapping[int, int]
) -> Contradiction | None:
    """Whether ``gpus`` can replace a node's inventory: ``stored`` is the model of each
    GPU row, ``held`` the job holding each allocated GPU. Refused: an index no GPU can
    have, an index or UUID twice, several models (the scheduler's ``Node`` holds one),
    a held GPU of another model than before (hardware does not change under a running
    job), and a held GPU gone while the others changed model (``set_gpus`` keeps a held
    GPU that vanished: the node would then mix models)."""
    seen: set[int] = set()
    uuids: set[str] = set()
    for g in gpus:
        if not 0 <= g.index <= MAX_GPU_INDEX:
            return Contradiction(reason=f"GPU index {g.index} is impossible (0-{MAX_GPU_INDEX})")
        if g.index in seen:
            return Contradiction(reason=f"GPU index {g.index} reported twice")
        if g.uuid and g.uuid in uuids:
            return Contradiction(reason=f"GPU UUID {g.uuid} reported twice")
        seen.add(g.index)
        uuids.add(g.uuid)
    models = sorted({g.model for g in gpus})
    if len(models) > 1:
        return Contradiction(reason=f"GPUs of several models ({', '.join(models)}) on one node")
    for g in gpus:
        old = stored.get(g.index)
        if g.index in held and old is not None and old != g.model:
            why = f"GPU {g.index} changed model {old} -> {g.model} while job {held[g.index]} holds it"
            return Contradiction(reason=why, under_job=True)
    for idx, job in sorted(held.items()):
        old = stored.get(idx)
        if idx not in seen and models and old is not None and old != models[0]:
            why = f"GPU {idx} held by job {job} is missing and the others are {models[0]}, not {old}"
            return Contradiction(reason=why, under_job=True)
    return None


def inventory_problem(s: Session, node: str, gpus: Sequence[GpuIn]) -> Contradiction | None:
    """``judge_inventory`` against the node's rows in this transaction."""
    stored = {i: m for i, m in s.execute(select(GpuRow.index, GpuRow.model).where(GpuRow.node == node))}
    held = s.execute(
        select(Allocation.gpu_index, Allocation.job_id).where(
            Allocation.node == node, Allocation.gpu_index.is_not(None)
        )
    )
    return judge_inventory(gpus, stored=stored, held={i: j for i, j in held if i is not None})


def set_gpus(s: Session, node: str, gpus: Sequence[GpuIn]) -> None:
    """Replace the inventory; a GPU that disappeared while allocated stays, unhealthy."""
    held = {  # a job on a slice or share of a GPU holds the GPU
        device_gpu(i)
        for i in s.scalars(
            select(Allocation.gpu_index).where(Allocation.node == node, Allocation.gpu_index.is_not(None))
        )
        if i is not None
    }
    existing = {g.index: g for g in s.scalars(select(GpuRow).where(GpuRow.node == node))}
    wanted = {g.index: g for g in gpus}
    for idx, row in existing.items():
        if idx not in wanted:
            if idx in held:
                row.healthy = False
            else:
                s.delete(row)
    for idx, g in wanted.items():
        found = existing.get(idx)
        if found is None:
            s.add(GpuRow(node=node, **g.model_dump()))
        else:
            row = found
            row.uuid, row.model, row.memory_mb = g.uuid, g.model, g.memory_mb
            row.nvlink_domain, row.healthy = g.nvlink_domain, g.healthy
            row.mig_enabled, row.mig_instances = g.mig_enabled, [m.model_dump() for m in g.mig_instances]


def put_node(
    *,
    db: Database,
    actor: Principal,
    name: str,
    spec: NodePut,
    now: float,
    live_since: float,
) -> NodeOut | Failure:
    if not actor.is_operator:
        return forbidden("only operators and admins register nodes")
    with db.write() as s:
        if s.get(Pool, spec.pool) is None:
            return invalid(f"pool: no pool {spec.pool}")
        bad = inventory_problem(s, name, spec.gpus)
        if bad is not None:  # an operator's mistake: refused (an agent's: cordoned, see sync.py)
            return conflict(f"gpus: {bad.reason}") if bad.under_job else invalid(f"gpus: {bad.reason}")
        node = s.get(NodeRow, name)
        if node is None:
            node = NodeRow(name=name, created_at=now, pool=spec.pool)
            s.add(node)
        node.pool, node.leaf, node.rack, node.cordoned = spec.pool, spec.leaf, spec.rack, spec.cordoned
        node.last_seen = now
        s.flush()
        set_gpus(s, name, spec.gpus)
        s.flush()
        out = _node_out(s, node, live_since)
        effects.invalidate_fleets(s)
        effects.wake_scheduler(s)
    return out


def label_node(
    *,
    db: Database,
    actor: Principal,
    name: str,
    change: NodeLabels,
    live_since: float,
) -> NodeOut | Failure:
    """An operator's features on a node (``--constraint`` matches them with the agent's):
    ``remove`` first, then ``add``; at most 64. A pending job they now admit is placed
    at the next pass."""
    if not actor.is_operator:
        return forbidden("only operators and admins label nodes")
    with db.write() as s:
        node = s.get(NodeRow, name)
        if node is None:
            return not_found(f"no node {name}")
        labels = (set(node.labels or ()) - set(change.remove)) | set(change.add)
        if len(labels) > 64:
            return invalid(f"labels: at most 64 on a node ({len(labels)} asked)")
        node.labels = sorted(labels)
        s.flush()
        out = _node_out(s, node, live_since)
        effects.invalidate_fleets(s)
        effects.wake_scheduler(s)
    return out


def delete_node(*, db: Database, actor: Principal, name: str) -> NodeOut | Failure:
    if not actor.is_operator:
        return forbidden("only operators and admins remove nodes")
    with db.write() as s:
        n = s.get(NodeRow, name)
        if n is None:
            return not_found(f"no node {name}")
        if s.scalar(select(Allocation.id).where(Allocation.node == name).limit(1)) is not None:
            return conflict(f"node {name} still runs jobs; cordon it and wait")
        out = _node_out(s, n, float("inf"))
        s.execute(delete(GpuRow).where(GpuRow.node == name))
        s.delete(n)
        effects.invalidate_fleets(s)
    return out


def write_heartbeats(s: Session, batches: Sequence[dict[str, float]]) -> list[None]:
    """A ``BulkOp``: each batch's ``last_seen`` values in one executemany (never moving
    a node's ``last_seen`` back)."""
    latest: dict[str, float] = {}
    for batch in batches:
        for node, at in batch.items():
            latest[node] = max(at, latest.get(node, at))
    if latest:
        stmt = (
            update(NodeRow)
            .where(NodeRow.name == bindparam("n"))
            .where(NodeRow.last_seen.is_(None) | (NodeRow.last_seen < bindparam("t")))
            .values(last_seen=bindparam("t"))
        )
        s.connection().execute(stmt, [{"n": n, "t": t} for n, t in sorted(latest.items())])
    return [None] * len(batches)
