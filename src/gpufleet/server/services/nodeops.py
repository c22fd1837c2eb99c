"""Writes on a node that services and loops share, each inside the caller's
transaction: a fleet event row (``gpu_events``), starting a drain, requeueing the jobs
that hold a node's (or one GPU's) GPUs."""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from gpufleet import mig
from gpufleet.server.jobstate.requeue import requeue
from gpufleet.server.store.models import Allocation, GpuEvent, Job, NodeRow


def add_event(
    s: Session,
    *,
    at: float,
    node: str,
    kind: str,
    severity: str,
    reason: str,
    actor: str,
    gpu: int | None = None,
    job_id: int | None = None,
) -> None:
    s.add(
        GpuEvent(
            at=at,
            node=node,
            gpu_index=gpu,
            kind=kind,
            severity=severity,
            reason=reason[:512],
            actor=actor[:64],
            job_id=job_id,
        )
    )


def requeue_on(
    s: Session, *, node: str, now: float, actor: str, reason: str, gpu: int | None = None, lost: bool = False
) -> int:
    """Requeue every job holding a GPU (or, ``gpu`` given, that GPU, one of its MIG
    slices or a share of it) on ``node``."""
    q = select(Allocation.job_id).where(Allocation.node == node)
    if gpu is not None:
        first = mig.slice_index(gpu, 0)
        unit = mig.share_index(gpu, 0)
        q = q.where(
            or_(
                Allocation.gpu_index == gpu,
                Allocation.gpu_index.between(first, first + mig.MEMORY_SLICES - 1),
                Allocation.gpu_index.between(unit, unit + mig.SHARE_UNITS - 1),
            )
        )
    ids = sorted(set(s.scalars(q)))
    n = 0
    for job in s.scalars(select(Job).where(Job.id.in_(ids)).order_by(Job.id)) if ids else ():
        if requeue(s, job, now=now, actor=actor, reason=reason, lost=(node,) if lost else ()) is not None:
            n += 1
    return n


def start_drain(
    s: Session, node: NodeRow, *, now: float, grace_s: float, requeue: bool, reason: str, actor: str
) -> None:
    """Cordon ``node`` and set its drain deadline: its jobs may finish until then, the
    rest are requeued (at once with ``requeue``)."""
    node.cordoned = True
    node.cordon_reason = f"drain: {reason}"[:256]
    node.drain_deadline = now if requeue else now + grace_s
    node.drain_requeue = requeue
    how = "requeue now" if requeue else f"grace {grace_s:g} s"
    add_event(
        s,
        at=now,
        node=node.name,
        kind="node_draining",
        severity="warning",
        actor=actor,
        reason=f"drain started ({how}): {reason}",
    )
