"""GPU health, the lifecycle pass's second half: a GPU a health rule fired on
(``health.py``: overheat, fatal XID, ECC, lost) is cordoned and its job requeued, with
a critical event; a ``temperature`` cordon is lifted after ``recover_after_s`` of
normal readings. Each function is one item in the caller's transaction; it returns 1
if it changed something."""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.server.decide.health import RECOVERABLE, Finding, HealthMonitor
from gpufleet.server.services import nodeops
from gpufleet.server.store.models import Allocation, GpuRow

log = logging.getLogger("gpufleet.lifecycle")
ACTOR = "lifecycle"


def cordon_gpu(s: Session, node: str, idx: int, found: list[Finding], now: float) -> int:
    gpu = s.get(GpuRow, (node, idx))
    if gpu is None or gpu.cordoned:
        return 0
    first = found[0]
    why = "; ".join(f.reason for f in found)
    gpu.cordoned, gpu.cordon_reason, gpu.cordon_rule, gpu.cordoned_at = True, why[:256], first.rule, now
    held = s.scalar(select(Allocation.job_id).where(Allocation.node == node, Allocation.gpu_index == idx))
    n = nodeops.requeue_on(s, node=node, gpu=idx, now=now, actor=ACTOR, reason=f"GPU {node}/{idx}: {why}")
    nodeops.add_event(
        s,
        at=now,
        node=node,
        gpu=idx,
        kind="gpu_cordoned",
        severity="critical",
        actor=ACTOR,
        reason=f"{first.rule}: {why}" + (f"; job {held} requeued" if n else ""),
        job_id=held,
    )
    log.warning("GPU %s/%d cordoned (%s)", node, idx, why)
    return 1


def recover_gpu(s: Session, node: str, idx: int, now: float, monitor: HealthMonitor) -> int:
    gpu = s.get(GpuRow, (node, idx))
    if gpu is None or not gpu.cordoned or gpu.cordon_rule not in RECOVERABLE:
        return 0
    nodeops.add_event(
        s,
        at=now,
        node=node,
        gpu=idx,
        kind="gpu_recovered",
        severity="info",
        actor=ACTOR,
        reason=f"{gpu.cordon_rule} normal for {monitor.rules.recover_after_s:.0f} s",
    )
    gpu.cordoned, gpu.cordon_reason, gpu.cordon_rule, gpu.cordoned_at = False, None, None, None
    return 1
