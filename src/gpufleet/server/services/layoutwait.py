"""Jobs that wait for a MIG layout an operator asked for (issue 30).

``gpufleet node mig NODE --gpu 3 --layout 1g.10gb,...`` is pending until the node's agent
applies it (``miglayouts.py``): once no job holds the GPU, at its next sync. A job asking
for a profile only that layout will create is not impossible, it is early: it is
accepted at submit (``submitfit.shape_problem`` asks ``reason``) and waits, outside the
queue as a dependency does, with the reason "MIGLayout: waiting for node-007's MIG layout
(1g.10gb x7) to take effect" (the scheduling pass asks ``judge``). Once the layout is
applied the job is an ordinary slice job; if the node refuses it (``mig_error``) the
layout is no longer pending and the job's reason becomes the core's "no schedulable ...".
A profile that no node has and no pending layout will create is still refused at submit.

Only profiles: a GPU share (``gpufleet node share``) takes effect when the server says so,
nothing waits for its node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet import mig
from gpufleet.scheduler import Blocked, Fleet, JobRequest
from gpufleet.scheduler.options import gpu_type_matches
from gpufleet.server.store.models import GpuRow, NodeRow

CODE = "MIGLayout"
"""The code of a ``Blocked`` job that waits for a layout (``Blocked.code``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Awaited:
    """A node with MIG layouts pending, and the slices it will have once they are applied."""

    node: str
    pool: str
    model: str
    """Its GPUs' model (``H100-80GB``)."""
    future: Mapping[str, int]
    """Profile -> instances on the node once every pending layout is applied (the other
    GPUs' instances as they are)."""
    pending: tuple[tuple[int, tuple[str, ...]], ...]
    """(GPU index, layout asked), by index."""

    def provides(self, profile: str) -> tuple[str, ...]:
        """The pending layouts that create ``profile``, in words."""
        return tuple(mig.layout_words(layout) for _, layout in self.pending if profile in layout)


def load(s: Session, *, pool: str | None = None) -> list[Awaited]:
    """The nodes (of ``pool``) with a MIG layout pending: one query over the GPU rows (a
    layout cleared by its agent is JSON null in some rows, dropped here as
    ``miglayouts.changes`` does), then the GPUs of those nodes."""
    rows = s.execute(select(GpuRow.node, GpuRow.mig_pending).where(GpuRow.mig_pending.is_not(None)))
    nodes = sorted({n for n, layout in rows if layout})  # not the whole GPU ([]): it makes no slice
    if not nodes:
        return []
    gq = (
        select(
            GpuRow.node,
            NodeRow.pool,
            GpuRow.index,
            GpuRow.model,
            GpuRow.mig_enabled,
            GpuRow.mig_instances,
            GpuRow.mig_pending,
        )
        .join(NodeRow, NodeRow.name == GpuRow.node)
        .where(GpuRow.node.in_(nodes))
        .order_by(GpuRow.node, GpuRow.index)
    )
    if pool is not None:
        gq = gq.where(NodeRow.pool == pool)
    per: dict[str, list[tuple[object, ...]]] = {}
    for row in s.execute(gq):
        per.setdefault(str(row[0]), []).append(tuple(row))
    return [a for a in (_awaited(name, gpus) for name, gpus in per.items()) if a is not None]


def _awaited(name: str, gpus: Sequence[tuple[object, ...]]) -> Awaited | None:
    future: dict[str, int] = {}
    pending: list[tuple[int, tuple[str, ...]]] = []
    for _node, _pool, index, _model, enabled, instances, asked in gpus:
        if isinstance(asked, list):
            layout = tuple(str(p) for p in asked)
            if layout:
                pending.append((int(index), layout))  # type: ignore[call-overload]
            for p in layout:
                future[p] = future.get(p, 0) + 1
        elif enabled and isinstance(instances, list):
            for m in instances:
                if isinstance(m, dict) and "profile" in m:
                    future[str(m["profile"])] = future.get(str(m["profile"]), 0) + 1
    if not pending:
        return None
    return Awaited(
        node=name, pool=str(gpus[0][1]), model=str(gpus[0][3]), future=future, pending=tuple(pending)
    )


def reason(awaited: Sequence[Awaited], *, pool: str, gpu_type: str | None, gpus: int) -> str | None:
    """Why a job of ``gpus`` slices of ``gpu_type`` in ``pool`` waits: the first node
    whose pending layouts will give it that many on one node (a slice job's slices are on
    one node), in words; None when no pending layout will."""
    if not mig.wants_slices(gpu_type) or gpu_type is None:
        return None
    for a in awaited:
        if a.pool != pool:
            continue
        for profile, count in a.future.items():
            made = a.provides(profile)
            if made and count >= gpus and gpu_type_matches(gpu_type, mig.slice_model(a.model, profile)):
                return f"waiting for {a.node}'s MIG layout ({' and '.join(made)}) to take effect"
    return None


def judge(pending: Sequence[JobRequest], *, fleet: Fleet, awaited: Sequence[Awaited]) -> dict[int, Blocked]:
    """The waiting slice jobs that only a pending layout can serve, held back with the
    reason (``CODE``). A job that a schedulable node of the live ``fleet`` could take
    (enough healthy slices of its type on one node) is not held: it waits for resources
    as usual, and may run there before the layout is applied."""
    if not awaited:
        return {}
    held: dict[int, Blocked] = {}
    seen: dict[tuple[str, str, int], str | None] = {}
    for job in pending:
        if not mig.wants_slices(job.gpu_type) or job.gpu_type is None or job.blocked is not None:
            continue
        key = (job.pool, job.gpu_type, job.gpus)
        if key not in seen:
            seen[key] = (
                None
                if _live_fits(fleet, job)
                else reason(awaited, pool=job.pool, gpu_type=job.gpu_type, gpus=job.gpus)
            )
        why = seen[key]
        if why is not None:
            held[int(job.id)] = Blocked(code=CODE, detail=why)
    return held


def _live_fits(fleet: Fleet, job: JobRequest) -> bool:
    gpu_type = job.gpu_type or ""
    return any(
        n.schedulable
        and n.pool == job.pool
        and n.gpus
        and gpu_type_matches(gpu_type, n.model)
        and sum(g.healthy for g in n.gpus) >= job.gpus
        for n in fleet.nodes
    )
