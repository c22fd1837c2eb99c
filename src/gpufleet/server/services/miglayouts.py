"""MIG layouts: an operator slices a GPU (``PUT /v1/nodes/{name}/gpus/{index}/mig``,
``gpufleet node mig``), its node's agent applies the layout, the server records what
became of it.

The order of things, as for a drain (``maintenance.py``):

1. The request is checked against ``gpufleet.mig``'s table for the GPU's model (a
   layout that cannot be placed is a 422 naming the profile), stored as the GPU's
   ``mig_pending``, and the GPU is cordoned (rule ``mig``) so that nothing new lands on
   it. A GPU already cordoned by an operator or a health rule keeps that cordon.
2. Once no job holds the GPU, each sync's reply carries the change (``SyncReply.mig``);
   the agent applies it through NVML and answers with a ``MigResult``.
3. Applied: ``mig_pending`` is cleared and the ``mig`` cordon lifted (the new instances
   come with the inventory the agent sends). Failed: the error is kept
   (``mig_error``), the request is dropped (the agent is not asked again) and the GPU
   stays cordoned with the reason, for an operator to look at.

A GPU whose agent reports MIG mode on is never handed to a job whole
(``inventory.py``); its slices are schedulable resources of their own.
Every step is a ``gpu_events`` row (``gpufleet node events``).

Shares (``set_shared``, ``gpufleet node share``): a GPU marked shared is never handed out
whole either; it takes jobs asking for part of one (``migindex``'s units). The switch is
the server's alone (no agent step: the agent runs a share's job on its GPU with the MPS
limits), so it is refused while any job holds the GPU, whole or a share of it: cordon the
GPU and wait, as for removing a node.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet import mig
from gpufleet.api.maintenance import MigLayoutIn, ShareIn
from gpufleet.api.nodes import MigChange, MigResult
from gpufleet.server.problems import Failure, conflict, forbidden, invalid, not_found
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.nodeops import add_event
from gpufleet.server.store import dispatch, effects
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import Allocation, GpuRow, NodeRow

RULE = "mig"
"""``GpuRow.cordon_rule`` of a cordon this module sets and lifts (no other)."""


def _words(layout: Sequence[str]) -> str:
    return ",".join(layout) if layout else "whole GPU"


def _gpu(s: Session, name: str, index: int) -> GpuRow | Failure:
    """GPU ``index`` of node ``name``, or the 404 saying which is missing."""
    if s.get(NodeRow, name) is None:
        return not_found(f"no node {name}")
    gpu = s.get(GpuRow, (name, index))
    return not_found(f"node {name} has no GPU {index}") if gpu is None else gpu


def set_layout(
    *,
    db: Database,
    actor: Principal,
    name: str,
    index: int,
    spec: MigLayoutIn,
    now: float,
    reason: str | None = None,
    idle_only: bool = False,
) -> Failure | None:
    """Ask node ``name`` to lay out GPU ``index`` as ``spec`` says (operators only).
    ``reason``: why, for the event and the cordon (the auto-MIG loop's "auto-mig: 3
    1g.10gb slices waiting"). ``idle_only``: a conflict, in this transaction, if a job
    holds the GPU (or one of its slices) or a layout is pending, so a loop never drains
    a GPU nor replaces a layout asked since it looked."""
    if not actor.is_operator:
        return forbidden("only operators and admins change MIG layouts")
    layout = [] if spec.whole else list(spec.layout or ())
    with db.write() as s:
        gpu = _gpu(s, name, index)
        if isinstance(gpu, Failure):
            return gpu
        if layout:
            model = mig.model_for(gpu.model)
            if model is None:
                known = ", ".join(m.name for m in mig.MODELS)
                return invalid(
                    f"GPU {index} of node {name} is a {gpu.model}: no MIG profiles for it ({known})"
                )
            try:
                mig.place_layout(model, layout)
            except mig.LayoutError as exc:
                return invalid(f"layout: {exc}")
            if gpu.mig_enabled is False:
                return conflict(
                    f"MIG mode is off on GPU {index} of node {name}: enable it on the node with "
                    f"nvidia-smi -i {index} -mig 1 (needs a GPU reset)"
                )
        elif not gpu.mig_enabled and gpu.mig_pending is None:
            return conflict(f"GPU {index} of node {name} is already whole (MIG mode is not on)")
        if idle_only and (gpu.mig_pending is not None or index in _held(s, name)):
            return conflict(f"GPU {index} of node {name} is in use or has a MIG layout pending")
        gpu.mig_pending, gpu.mig_error = layout, None
        if not gpu.cordoned:
            gpu.cordoned, gpu.cordon_rule, gpu.cordoned_at = True, RULE, now
        why = f"asked by {actor.name}" if reason is None else f"({reason})"
        if gpu.cordon_rule == RULE:
            gpu.cordon_reason = f"MIG layout {_words(layout)} {why}"[:256]
        add_event(
            s,
            at=now,
            node=name,
            gpu=index,
            kind="mig-asked",
            severity="info",
            actor=actor.name,
            reason=f"MIG layout {_words(layout)}{'' if reason is None else f' ({reason})'}: "
            "the GPU takes no new job until its node applies it",
        )
        dispatch.touch(s, [name])  # an idle GPU's node hears of it at once
        effects.invalidate_fleets(s)  # the GPU is cordoned
    return None


def set_shared(
    *, db: Database, actor: Principal, name: str, index: int, spec: ShareIn, now: float
) -> Failure | None:
    """Mark GPU ``index`` of node ``name`` shared, or whole again (operators only);
    the same state again changes nothing."""
    if not actor.is_operator:
        return forbidden("only operators and admins share GPUs")
    with db.write() as s:
        gpu = _gpu(s, name, index)
        if isinstance(gpu, Failure):
            return gpu
        if bool(gpu.shared) == spec.shared:
            return None
        if spec.shared and (gpu.mig_enabled or gpu.mig_pending):
            return conflict(
                f"GPU {index} of node {name} is in MIG mode: its slices are already shared; "
                f"make it whole first (gpufleet node mig {name} --gpu {index} --whole)"
            )
        jobs = sorted(
            {
                j
                for j, i in s.execute(
                    select(Allocation.job_id, Allocation.gpu_index).where(
                        Allocation.node == name, Allocation.gpu_index.is_not(None)
                    )
                )
                if i is not None and mig.device_gpu(i) == index
            }
        )
        if jobs:
            held = ", ".join(map(str, jobs[:5])) + (" ..." if len(jobs) > 5 else "")
            return conflict(
                f"GPU {index} of node {name} runs job(s) {held}: cordon it "
                f"(gpufleet node cordon {name} --gpu {index}) and wait for them to end"
            )
        gpu.shared = spec.shared
        what = "shared: takes GPU shares, no whole-GPU job" if spec.shared else "whole again: no shares"
        add_event(
            s,
            at=now,
            node=name,
            gpu=index,
            kind="share-on" if spec.shared else "share-off",
            severity="info",
            actor=actor.name,
            reason=f"GPU {what}",
        )
        effects.invalidate_fleets(s)
        effects.wake_scheduler(s)  # shares may now land on it (or whole-GPU jobs)
    return None


_PENDING = select(GpuRow.index, GpuRow.mig_pending).where(GpuRow.mig_pending.is_not(None))


def changes(s: Session, node: str) -> list[MigChange]:
    """The layouts to send node ``node`` now: those asked for on GPUs no job holds."""
    pending = s.execute(_PENDING.where(GpuRow.node == node)).all()
    if not pending:
        return []
    held = _held(s, node)
    return [
        MigChange(gpu=int(i), layout=list(layout))
        for i, layout in pending
        if i not in held and layout is not None
    ]


def _held(s: Session, node: str) -> set[int]:
    """The GPUs of ``node`` a job holds (a job on one of its slices holds the GPU too)."""
    q = select(Allocation.gpu_index).where(Allocation.node == node, Allocation.gpu_index.is_not(None))
    return {mig.device_gpu(i) for i in s.scalars(q) if i is not None}


def record(s: Session, node: str, results: Sequence[MigResult], *, actor: str, now: float) -> bool:
    """Take the agent's answers; True when a GPU's cordon changed (the fleet did).
    An answer about a layout no longer asked for (an operator asked again since) is
    ignored: the agent is sent the new one."""
    changed = False
    for r in results:
        gpu = s.get(GpuRow, (node, r.gpu))
        if gpu is None or gpu.mig_pending is None or list(gpu.mig_pending) != list(r.layout):
            continue
        gpu.mig_pending = None
        what = _words(r.layout)
        if r.error is None:
            gpu.mig_error = None
            if gpu.cordoned and gpu.cordon_rule == RULE:
                gpu.cordoned, gpu.cordon_reason, gpu.cordon_rule, gpu.cordoned_at = False, None, None, None
                changed = True
            add_event(
                s, at=now, node=node, gpu=r.gpu, kind="mig-applied", severity="info", actor=actor, reason=what
            )
            continue
        gpu.mig_error = r.error[:512]
        if gpu.cordoned and gpu.cordon_rule == RULE:
            gpu.cordon_reason = f"MIG layout {what} failed: {r.error}"[:256]
        add_event(
            s,
            at=now,
            node=node,
            gpu=r.gpu,
            kind="mig-failed",
            severity="warning",
            actor=actor,
            reason=f"MIG layout {what} failed: {r.error}",
        )
    return changed
