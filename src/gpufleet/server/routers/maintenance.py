"""Node maintenance (operators and admins; users get 403): cordon, uncordon, drain,
rollouts, rolling driver upgrades, and the fleet event log (GPU cordons, lost nodes,
drains, upgrade steps: the alerts)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from gpufleet.api.base import MAX_GPU_INDEX
from gpufleet.api.maintenance import (
    CordonIn,
    DrainIn,
    FleetEventOut,
    MigLayoutIn,
    RolloutIn,
    RolloutOut,
    ShareIn,
    UncordonIn,
)
from gpufleet.api.nodes import NodeOut
from gpufleet.api.upgrades import ResumeIn, UpgradeIn
from gpufleet.server.http.deps import Me, NodeNameIn, PartsDep
from gpufleet.server.problems import Failure, ObjectId, Offset, unwrap
from gpufleet.server.routers.agents import HotDep
from gpufleet.server.services import maintenance, miglayouts, nodes, upgrades

router = APIRouter(tags=["maintenance"])


def _node(parts: PartsDep, me: Me, hot: HotDep, name: str, done: Failure | None) -> NodeOut:
    unwrap(done)
    return unwrap(nodes.show_node(db=parts.db, actor=me, name=name, live_since=parts.live_since(), hot=hot))


@router.post("/nodes/{name}/cordon", response_model=NodeOut)
def cordon(name: NodeNameIn, parts: PartsDep, me: Me, hot: HotDep, spec: CordonIn | None = None) -> NodeOut:
    done = maintenance.cordon(db=parts.db, actor=me, name=name, spec=spec or CordonIn(), now=parts.now())
    return _node(parts, me, hot, name, done)


@router.post("/nodes/{name}/uncordon", response_model=NodeOut)
def uncordon(
    name: NodeNameIn, parts: PartsDep, me: Me, hot: HotDep, spec: UncordonIn | None = None
) -> NodeOut:
    done = maintenance.uncordon(
        db=parts.db, actor=me, name=name, spec=spec or UncordonIn(), now=parts.now(), monitor=hot.health
    )
    return _node(parts, me, hot, name, done)


@router.post("/nodes/{name}/drain", response_model=NodeOut)
def drain(name: NodeNameIn, parts: PartsDep, me: Me, hot: HotDep, spec: DrainIn | None = None) -> NodeOut:
    done = maintenance.drain(db=parts.db, actor=me, name=name, spec=spec or DrainIn(), now=parts.now())
    return _node(parts, me, hot, name, done)


@router.put("/nodes/{name}/gpus/{index}/mig", response_model=NodeOut)
def set_mig_layout(
    name: NodeNameIn,
    index: Annotated[int, Path(ge=0, le=MAX_GPU_INDEX)],
    spec: MigLayoutIn,
    parts: PartsDep,
    me: Me,
    hot: HotDep,
) -> NodeOut:
    """Slice GPU ``index`` with MIG (or make it whole): the GPU is cordoned at once, and
    its node applies the layout once no job holds it (``gpufleet node mig``)."""
    done = miglayouts.set_layout(db=parts.db, actor=me, name=name, index=index, spec=spec, now=parts.now())
    return _node(parts, me, hot, name, done)


@router.put("/nodes/{name}/gpus/{index}/share", response_model=NodeOut)
def set_gpu_shared(
    name: NodeNameIn,
    index: Annotated[int, Path(ge=0, le=MAX_GPU_INDEX)],
    spec: ShareIn,
    parts: PartsDep,
    me: Me,
    hot: HotDep,
) -> NodeOut:
    """Share GPU ``index`` (jobs asking ``--gpu-fraction`` / ``--gpu-memory`` run on it under
    MPS) or make it whole again; refused while a job holds it (``gpufleet node share``)."""
    done = miglayouts.set_shared(db=parts.db, actor=me, name=name, index=index, spec=spec, now=parts.now())
    return _node(parts, me, hot, name, done)


@router.post("/rollouts", status_code=201, response_model=RolloutOut)
def start_rollout(spec: RolloutIn, parts: PartsDep, me: Me) -> RolloutOut:
    return unwrap(maintenance.start_rollout(db=parts.db, actor=me, spec=spec, now=parts.now()))


@router.get("/rollouts/current", response_model=RolloutOut)
def current_rollout(parts: PartsDep, me: Me) -> RolloutOut:
    return unwrap(maintenance.show_rollout(db=parts.db, actor=me, rollout_id=None))


@router.get("/rollouts/{rollout_id}", response_model=RolloutOut)
def show_rollout(rollout_id: ObjectId, parts: PartsDep, me: Me) -> RolloutOut:
    return unwrap(maintenance.show_rollout(db=parts.db, actor=me, rollout_id=rollout_id))


@router.post("/rollouts/{rollout_id}/cancel", response_model=RolloutOut)
def cancel_rollout(rollout_id: ObjectId, parts: PartsDep, me: Me) -> RolloutOut:
    return unwrap(maintenance.cancel_rollout(db=parts.db, actor=me, rollout_id=rollout_id, now=parts.now()))


@router.post("/upgrades", status_code=201, response_model=RolloutOut)
def start_upgrade(spec: UpgradeIn, parts: PartsDep, me: Me) -> RolloutOut:
    """Roll a driver upgrade through ``nodes``: drain, upgrade (the nodes' own hook, or
    by hand), verify, uncordon; paused at the first failed verification."""
    return unwrap(upgrades.start(db=parts.db, actor=me, spec=spec, now=parts.now()))


@router.get("/upgrades/current", response_model=RolloutOut)
def current_upgrade(parts: PartsDep, me: Me) -> RolloutOut:
    return unwrap(upgrades.show(db=parts.db, actor=me, rollout_id=None))


@router.get("/upgrades/{rollout_id}", response_model=RolloutOut)
def show_upgrade(rollout_id: ObjectId, parts: PartsDep, me: Me) -> RolloutOut:
    return unwrap(upgrades.show(db=parts.db, actor=me, rollout_id=rollout_id))


@router.post("/upgrades/{rollout_id}/pause", response_model=RolloutOut)
def pause_upgrade(rollout_id: ObjectId, parts: PartsDep, me: Me) -> RolloutOut:
    return unwrap(upgrades.pause(db=parts.db, actor=me, rollout_id=rollout_id, now=parts.now()))


@router.post("/upgrades/{rollout_id}/resume", response_model=RolloutOut)
def resume_upgrade(rollout_id: ObjectId, parts: PartsDep, me: Me, spec: ResumeIn | None = None) -> RolloutOut:
    return unwrap(
        upgrades.resume(
            db=parts.db, actor=me, rollout_id=rollout_id, spec=spec or ResumeIn(), now=parts.now()
        )
    )


@router.post("/upgrades/{rollout_id}/abort", response_model=RolloutOut)
def abort_upgrade(rollout_id: ObjectId, parts: PartsDep, me: Me) -> RolloutOut:
    return unwrap(upgrades.abort(db=parts.db, actor=me, rollout_id=rollout_id, now=parts.now()))


@router.get("/fleet/events", response_model=list[FleetEventOut], tags=["fleet"])
def events(
    parts: PartsDep,
    me: Me,
    node: str | None = None,
    after: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    alerts: bool = False,
) -> list[FleetEventOut]:
    return unwrap(
        maintenance.list_events(
            db=parts.db, actor=me, node=node, after_id=after, limit=limit, alerts_only=alerts
        )
    )
