"""``GET /v1/fleet/summary``: the numbers a dashboard header (or ``gpufleet demo``)
shows, from a few aggregate queries instead of listing every job and node."""

from __future__ import annotations

from sqlalchemy import func, select

from gpufleet.api.nodes import FleetSummary
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import Allocation, GpuRow, Job, NodeRow


def summary(*, db: Database, hot: AgentState, live_since: float) -> FleetSummary:
    with db.read() as s:
        nodes = s.scalar(select(func.count()).select_from(NodeRow)) or 0
        ready = (
            s.scalar(select(func.count()).select_from(NodeRow).where(NodeRow.last_seen >= live_since)) or 0
        )
        gpus = s.scalar(select(func.count()).select_from(GpuRow)) or 0
        unhealthy = s.scalar(select(func.count()).select_from(GpuRow).where(GpuRow.healthy.is_(False))) or 0
        busy = (
            s.scalar(select(func.count()).select_from(Allocation).where(Allocation.gpu_index.is_not(None)))
            or 0
        )
        jobs = dict(s.execute(select(Job.state, func.count()).group_by(Job.state)).all())
    return FleetSummary(
        nodes=nodes,
        nodes_ready=ready,
        gpus=gpus,
        gpus_busy=busy,
        gpus_unhealthy=unhealthy,
        jobs={str(k): int(v) for k, v in sorted(jobs.items())},
        sync=hot.latencies.stats(),
    )
