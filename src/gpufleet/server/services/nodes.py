"""Nodes: list/show for everyone, register/update and sync for operators.

Sync is the server half of DESIGN.md's agent protocol. It is idempotent: it first
records what the node observed (passive: SCHEDULED -> RUNNING on ``running``;
SCHEDULED/RUNNING -> COMPLETED/FAILED on ``exited``; a job that was told to stop and is
no longer reported is confirmed stopped), then answers the jobs that node should run.
Replaying a message, or losing one, leaves the same state and the same answer.
Registration (``PUT``) counts as a sighting of the node, like a sync.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from gpufleet.server.db import Database
from gpufleet.server.models import Allocation, GpuRow, Job, NodeRow, Pool, User
from gpufleet.server.problems import Failure, conflict, forbidden, invalid, not_found
from gpufleet.server.schemas import DesiredJob, GpuIn, GpuOut, NodeOut, NodePut, NodeSync, SyncReply
from gpufleet.server.services.accounts import Principal
from gpufleet.server.services.inventory import FleetCache
from gpufleet.server.states import ACTIVE, JobState
from gpufleet.server.transitions import move, ref, stop_values

Waker = Callable[[], None]


def _node_out(s: Session, n: NodeRow, live_since: float) -> NodeOut:
    gpus = list(s.scalars(select(GpuRow).where(GpuRow.node == n.name).order_by(GpuRow.index)))
    held = dict(
        s.execute(
            select(Allocation.gpu_index, Allocation.job_id).where(
                Allocation.node == n.name, Allocation.gpu_index.is_not(None)
            )
        )
        .tuples()
        .all()
    )
    ready = n.last_seen is not None and n.last_seen >= live_since
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
        gpus_free=sum(1 for g in gpus if g.healthy and g.index not in held),
        gpus=[
            GpuOut(
                index=g.index,
                uuid=g.uuid,
                model=g.model,
                memory_mb=g.memory_mb,
                nvlink_domain=g.nvlink_domain,
                healthy=g.healthy,
                job_id=held.get(g.index),
            )
            for g in gpus
        ],
    )


def list_nodes(
    *, db: Database, actor: Principal, live_since: float, pool: str | None = None
) -> list[NodeOut]:
    with db.read() as s:
        q = select(NodeRow).order_by(NodeRow.name)
        if pool is not None:
            q = q.where(NodeRow.pool == pool)
        return [_node_out(s, n, live_since) for n in s.scalars(q)]


def show_node(*, db: Database, actor: Principal, name: str, live_since: float) -> NodeOut | Failure:
    with db.read() as s:
        n = s.get(NodeRow, name)
        return not_found(f"no node {name}") if n is None else _node_out(s, n, live_since)


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


def _observe(s: Session, node: str, body: NodeSync, actor: str, now: float) -> bool:
    """Apply the node's observations. Returns whether a job changed; raises _Retry when a
    CAS lost against a concurrent writer."""
    changed = False
    mine = set(s.scalars(select(Allocation.job_id).where(Allocation.node == node)))
    seen = {o.job_id: o for o in body.jobs}
    if seen:
        for job in s.scalars(select(Job).where(Job.id.in_(seen), Job.id.in_(mine))):
            o = seen[job.id]
            st = JobState(job.state)
            if o.state == "running" and st == JobState.SCHEDULED:
                ok = move(
                    s,
                    ref(job),
                    JobState.RUNNING,
                    actor=actor,
                    reason=f"running on {node}",
                    now=now,
                    values={"started_at": now},
                )
            elif o.state == "exited" and st in ACTIVE:
                code = o.exit_code if o.exit_code is not None else -1
                to = JobState.COMPLETED if code == 0 else JobState.FAILED
                vals = stop_values(s, job, now=now, confirmed=True) | {"exit_code": code}
                ok = move(
                    s,
                    ref(job),
                    to,
                    actor=actor,
                    reason=f"exited with code {code} on {node}",
                    now=now,
                    values=vals,
                )
            else:
                continue
            if not ok:
                raise _Retry
            changed = True
    # Jobs told to stop here: confirmed once the node no longer reports them running.
    stopping = select(Job).where(Job.stopping_on.is_not(None), Job.stopping_on.contains(node))
    for job in s.scalars(stopping):
        nodes = [n for n in (job.stopping_on or "").split(",") if n]
        if node in nodes and not (job.id in seen and seen[job.id].state == "running"):
            rest = [n for n in nodes if n != node]
            job.stopping_on = ",".join(rest) or None
            changed = True
    return changed


def _desired(s: Session, node: str) -> list[DesiredJob]:
    q = (
        select(Job, User.name, Allocation.gpu_index)
        .join(Allocation, Allocation.job_id == Job.id)
        .join(User, User.id == Job.user_id)
        .where(Allocation.node == node, Job.state.in_([str(a) for a in ACTIVE]))
        .order_by(Job.id)
    )
    out: dict[int, tuple[Job, str, list[int]]] = {}
    for job, user, idx in s.execute(q).tuples():
        entry = out.setdefault(job.id, (job, user, []))
        if idx is not None:
            entry[2].append(idx)
    return [
        DesiredJob(
            job_id=job.id,
            name=job.name,
            command=job.command,
            env=job.env,
            image=job.image,
            gpus=sorted(gpus),
            time_limit_s=job.time_limit_s,
            deadline=None
            if job.time_limit_s is None or job.started_at is None
            else job.started_at + job.time_limit_s,
            user=user,
            output=job.output,
            error=job.error,
        )
        for job, user, gpus in out.values()
    ]


def sync_node(
    *,
    db: Database,
    actor: Principal,
    name: str,
    body: NodeSync,
    now: float,
    fleets: FleetCache,
    waker: Waker,
) -> SyncReply | Failure:
    if not actor.is_operator:
        return forbidden("only operators and admins may sync nodes (node credentials come later)")
    if body.gpus is not None:
        bad = _check_gpus(body.gpus)
        if bad is not None:
            return bad
    for _ in range(5):
        try:
            with db.write() as s:
                node = s.get(NodeRow, name)
                if node is None:
                    if body.gpus is None:
                        return not_found(f"no node {name}: register it or send its gpus")
                    node = NodeRow(name=name, created_at=now, pool="default")
                    s.add(node)
                was_ready_at = node.last_seen
                node.last_seen = now
                s.flush()
                if body.gpus is not None:
                    _set_gpus(s, name, body.gpus)
                    s.flush()
                changed = _observe(s, name, body, actor.name, now)
                s.flush()
                reply = SyncReply(node=name, jobs=_desired(s, name))
        except _Retry:
            continue
        if body.gpus is not None:
            fleets.invalidate()
        if changed or was_ready_at is None or body.gpus is not None:
            waker()
        return reply
    return conflict(f"node {name}: its jobs are changing too fast; sync again")


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


class _Retry(Exception):
    pass
