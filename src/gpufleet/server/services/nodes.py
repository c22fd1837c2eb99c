"""Nodes: list/show for everyone, register/update and sync for operators.

Sync, the agent protocol, lives in ``services/sync.py``. Registration (``PUT``) counts
as a sighting of the node, like a sync. The latest telemetry an agent sent (hot data,
``HotState``) is shown with each GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from gpufleet.server.db import Database
from gpufleet.server.hot import HotState
from gpufleet.server.models import Allocation, GpuRow, NodeRow, Pool
from gpufleet.server.problems import Failure, conflict, forbidden, invalid, not_found
from gpufleet.server.schemas import GpuIn, GpuOut, NodeOut, NodePut
from gpufleet.server.services.accounts import Principal
from gpufleet.server.services.inventory import FleetCache

Waker = Callable[[], None]


def _node_out(s: Session, n: NodeRow, live_since: float, hot: HotState | None = None) -> NodeOut:
    gpus = list(s.scalars(select(GpuRow).where(GpuRow.node == n.name).order_by(GpuRow.index)))
    held = dict(
        s.execute(
            select(Allocation.gpu_index, Allocation.job_id).where(
                Allocation.node == n.name, Allocation.gpu_index.is_not(None)
            )
        ).all()
    )
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
        gpus_free=sum(1 for g in gpus if g.healthy and not g.cordoned and g.index not in held),
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
            )
            for g in gpus
        ],
        address=n.address,
        driver_version=tel.driver_version if tel is not None else None,
        cuda_version=tel.cuda_version if tel is not None else None,
        telemetry_at=tel.at if tel is not None else None,
        cordon_reason=n.cordon_reason,
        lost=n.lost_at is not None,
        draining=n.drain_deadline is not None,
        drain_deadline=n.drain_deadline,
        gpus_cordoned=sum(1 for g in gpus if g.cordoned),
    )


def list_nodes(
    *, db: Database, actor: Principal, live_since: float, pool: str | None = None, hot: HotState | None = None
) -> list[NodeOut]:
    with db.read() as s:
        q = select(NodeRow).order_by(NodeRow.name)
        if pool is not None:
            q = q.where(NodeRow.pool == pool)
        return [_node_out(s, n, live_since, hot) for n in s.scalars(q)]


def show_node(
    *, db: Database, actor: Principal, name: str, live_since: float, hot: HotState | None = None
) -> NodeOut | Failure:
    with db.read() as s:
        n = s.get(NodeRow, name)
        return not_found(f"no node {name}") if n is None else _node_out(s, n, live_since, hot)


def _check_gpus(gpus: Sequence[GpuIn]) -> Failure | None:
    if len({g.index for g in gpus}) != len(gpus):
        return invalid("gpus: duplicate GPU index")
    if len({g.model for g in gpus}) > 1:
        return invalid("gpus: a node has one GPU model")
    return None


def _set_gpus(s: Session, node: str, gpus: Sequence[GpuIn]) -> None:
    """Replace the inventory; a GPU that disappeared while allocated stays, unhealthy."""
    held = set(
        s.scalars(
            select(Allocation.gpu_index).where(Allocation.node == node, Allocation.gpu_index.is_not(None))
        )
    )
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


def put_node(
    *,
    db: Database,
    actor: Principal,
    name: str,
    spec: NodePut,
    now: float,
    live_since: float,
    fleets: FleetCache,
    waker: Waker,
) -> NodeOut | Failure:
    if not actor.is_operator:
        return forbidden("only operators and admins register nodes")
    bad = _check_gpus(spec.gpus)
    if bad is not None:
        return bad
    with db.write() as s:
        if s.get(Pool, spec.pool) is None:
            return invalid(f"pool: no pool {spec.pool}")
        node = s.get(NodeRow, name)
        if node is None:
            node = NodeRow(name=name, created_at=now, pool=spec.pool)
            s.add(node)
        node.pool, node.leaf, node.rack, node.cordoned = spec.pool, spec.leaf, spec.rack, spec.cordoned
        node.last_seen = now
        s.flush()
        _set_gpus(s, name, spec.gpus)
        s.flush()
        out = _node_out(s, node, live_since)
    fleets.invalidate()
    waker()
    return out


def delete_node(*, db: Database, actor: Principal, name: str, fleets: FleetCache) -> NodeOut | Failure:
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
    fleets.invalidate()
    return out
