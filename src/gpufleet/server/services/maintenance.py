"""Maintenance: cordon, uncordon and drain a node or one GPU, rolling drains through the
fleet (rollouts), and the fleet event log. Operators and admins only.

- ``cordon``: nothing new lands on the node (or GPU); running jobs stay;
- ``drain``: cordon, then running jobs may finish for ``grace``; the lifecycle loop
  requeues what is left then (at once with ``requeue``);
- ``uncordon``: back in service; a node of the active rollout is then *done* and the
  rollout drains the next one;
- a rollout keeps at most ``max_unavailable`` of its nodes draining or drained at once;
  a driver upgrade (``upgrades.py``) also upgrades and verifies each node, and an
  ``uncordon`` of a node it holds presses on to its verification instead.

Each change is one transaction with its ``gpu_events`` row, and marks what follows its
commit (``effects.py``): the fleet caches dropped, the scheduler woken (an uncordon), the
lifecycle loop woken (a drain or rollout it now runs).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.api.maintenance import (
    CordonIn,
    DrainIn,
    FleetEventOut,
    RolloutIn,
    RolloutOut,
    UncordonIn,
)
from gpufleet.server.decide.health import HealthMonitor
from gpufleet.server.problems import Failure, conflict, forbidden, invalid, not_found
from gpufleet.server.services import upgrades
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.nodeops import add_event, start_drain
from gpufleet.server.services.rolloutview import rollout_out, seconds
from gpufleet.server.store import effects
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import GpuEvent, GpuRow, NodeRow, Rollout, RolloutNode

__all__ = ["seconds"]  # re-exported: callers of maintenance.seconds keep working


def _operator(actor: Principal) -> Failure | None:
    return None if actor.is_operator else forbidden("only operators and admins do node maintenance")


def _gpu(s: Session, node: str, gpu: int) -> GpuRow | Failure:
    row = s.get(GpuRow, (node, gpu))
    return not_found(f"node {node} has no GPU {gpu}") if row is None else row


def cordon(*, db: Database, actor: Principal, name: str, spec: CordonIn, now: float) -> Failure | None:
    if (bad := _operator(actor)) is not None:
        return bad
    reason = spec.reason or f"cordoned by {actor.name}"
    with db.write() as s:
        node = s.get(NodeRow, name)
        if node is None:
            return not_found(f"no node {name}")
        if spec.gpu is None:
            node.cordoned, node.cordon_reason = True, reason[:256]
        else:
            gpu = _gpu(s, name, spec.gpu)
            if isinstance(gpu, Failure):
                return gpu
            gpu.cordoned, gpu.cordon_reason, gpu.cordon_rule, gpu.cordoned_at = True, reason[:256], None, now
        add_event(
            s,
            at=now,
            node=name,
            gpu=spec.gpu,
            kind="cordoned",
            severity="info",
            actor=actor.name,
            reason=reason,
        )
        effects.invalidate_fleets(s)
    return None


def uncordon(
    *, db: Database, actor: Principal, name: str, spec: UncordonIn, now: float, monitor: HealthMonitor
) -> Failure | None:
    if (bad := _operator(actor)) is not None:
        return bad
    with db.write() as s:
        node = s.get(NodeRow, name)
        if node is None:
            return not_found(f"no node {name}")
        if spec.gpu is not None:
            gpu = _gpu(s, name, spec.gpu)
            if isinstance(gpu, Failure):
                return gpu
            gpu.cordoned, gpu.cordon_reason, gpu.cordon_rule, gpu.cordoned_at = False, None, None, None
            monitor.forget(name, spec.gpu)
        else:
            held = upgrades.member_of_open(s, name)
            if held is not None:  # a driver upgrade holds it: press on, uncordoned once verified
                ro, m = held
                if not upgrades.press_on(s, ro, m, now=now, actor=actor.name):
                    return conflict(
                        f"node {name} is {m.state} in driver upgrade {ro.id}: it is uncordoned once "
                        "verified (or abort the upgrade)"
                    )
                effects.wake_lifecycle(s)
                return None
            node.cordoned, node.cordon_reason = False, None
            node.drain_deadline, node.drain_requeue = None, False
            _rollout_member_done(s, name, now)
        add_event(
            s,
            at=now,
            node=name,
            gpu=spec.gpu,
            kind="uncordoned",
            severity="info",
            actor=actor.name,
            reason=f"uncordoned by {actor.name}",
        )
        effects.invalidate_fleets(s)
        effects.wake_scheduler(s)
    return None


def drain(*, db: Database, actor: Principal, name: str, spec: DrainIn, now: float) -> Failure | None:
    if (bad := _operator(actor)) is not None:
        return bad
    grace = seconds(spec.grace, "grace")
    if isinstance(grace, Failure):
        return grace
    with db.write() as s:
        node = s.get(NodeRow, name)
        if node is None:
            return not_found(f"no node {name}")
        start_drain(
            s,
            node,
            now=now,
            grace_s=grace,
            requeue=spec.requeue,
            reason=spec.reason or f"drained by {actor.name}",
            actor=actor.name,
        )
        effects.invalidate_fleets(s)
        effects.wake_lifecycle(s)  # it requeues what is left at the deadline
    return None


def _rollout_member_done(s: Session, node: str, now: float) -> None:
    q = (
        select(RolloutNode)
        .join(Rollout, Rollout.id == RolloutNode.rollout_id)
        .where(
            Rollout.state == "active",
            RolloutNode.node == node,
            RolloutNode.state.in_(("draining", "drained")),
        )
    )
    for m in s.scalars(q):
        m.state, m.finished_at = "done", now


# -- rollouts -------------------------------------------------------------------------------------


def start_rollout(*, db: Database, actor: Principal, spec: RolloutIn, now: float) -> RolloutOut | Failure:
    if (bad := _operator(actor)) is not None:
        return bad
    grace = seconds(spec.grace, "grace")
    if isinstance(grace, Failure):
        return grace
    if spec.all == bool(spec.nodes):
        return invalid("give either nodes or all=true")
    with db.write() as s:
        if s.scalar(select(Rollout.id).where(Rollout.state.in_(upgrades.OPEN))) is not None:
            return conflict("a rollout is already active: wait for it or cancel it")
        q = select(NodeRow.name).order_by(NodeRow.name)
        if spec.pool is not None:
            q = q.where(NodeRow.pool == spec.pool)
        known = list(s.scalars(q))
        names = known if spec.all else list(dict.fromkeys(spec.nodes))
        missing = sorted(set(names) - set(known))
        if missing:
            return not_found(f"no such node(s): {', '.join(missing[:10])}")
        if not names:
            return invalid("no nodes to roll through")
        ro = Rollout(
            created_at=now,
            created_by=actor.name,
            state="active",
            max_unavailable=spec.max_unavailable,
            grace_s=grace,
            requeue=spec.requeue,
            reason=spec.reason or f"rollout by {actor.name}",
        )
        s.add(ro)
        s.flush()
        s.add_all(
            RolloutNode(rollout_id=ro.id, node=n, position=i, state="waiting") for i, n in enumerate(names)
        )
        s.flush()
        out = rollout_out(s, ro)
        effects.wake_lifecycle(s)  # it drains the first nodes
    return out


def show_rollout(*, db: Database, actor: Principal, rollout_id: int | None) -> RolloutOut | Failure:
    """``rollout_id`` None: the active rollout, else the latest."""
    if (bad := _operator(actor)) is not None:
        return bad
    with db.read() as s:
        if rollout_id is None:
            ro = s.scalar(
                select(Rollout).order_by((Rollout.state == "active").desc(), Rollout.id.desc()).limit(1)
            )
        else:
            ro = s.get(Rollout, rollout_id)
        if ro is None:
            return not_found("no rollout" if rollout_id is None else f"no rollout {rollout_id}")
        return rollout_out(s, ro)


def cancel_rollout(*, db: Database, actor: Principal, rollout_id: int, now: float) -> RolloutOut | Failure:
    """Stops starting drains; nodes already draining stay cordoned until uncordoned."""
    if (bad := _operator(actor)) is not None:
        return bad
    with db.write() as s:
        ro = s.get(Rollout, rollout_id)
        if ro is None:
            return not_found(f"no rollout {rollout_id}")
        if ro.expect_driver is not None:
            return conflict(f"rollout {rollout_id} is a driver upgrade: abort it (gpufleet upgrade abort)")
        if ro.state != "active":
            return conflict(f"rollout {rollout_id} is {ro.state}")
        ro.state, ro.finished_at = "cancelled", now
        s.flush()
        return rollout_out(s, ro)


# -- events ---------------------------------------------------------------------------------------


def list_events(
    *, db: Database, actor: Principal, node: str | None, after_id: int, limit: int, alerts_only: bool
) -> list[FleetEventOut] | Failure:
    """Oldest first, after ``after_id`` (0: the latest ``limit``)."""
    if (bad := _operator(actor)) is not None:
        return bad
    with db.read() as s:
        q = select(GpuEvent)
        if node is not None:
            q = q.where(GpuEvent.node == node)
        if alerts_only:
            q = q.where(GpuEvent.severity.in_(("critical", "warning")))
        if after_id > 0:
            rows = list(s.scalars(q.where(GpuEvent.id > after_id).order_by(GpuEvent.id).limit(limit)))
        else:
            rows = list(reversed(list(s.scalars(q.order_by(GpuEvent.id.desc()).limit(limit)))))
        return [
            FleetEventOut(
                id=e.id,
                at=e.at,
                node=e.node,
                gpu_index=e.gpu_index,
                kind=e.kind,
                severity=e.severity,
                reason=e.reason,
                actor=e.actor,
                job_id=e.job_id,
            )
            for e in rows
        ]
