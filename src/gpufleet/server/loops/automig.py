"""The auto-MIG loop (``gpufleet server --auto-mig``; off by default): idle GPUs are laid
out anew when MIG slices wait and whole GPUs do not, and back to whole in the reverse
case. What to change is the pure planner's (``gpufleet.scheduler.migplan``); this loop
only reads its input and asks the layouts as an operator would.

Each step, observe then act:

1. *observe* (one read transaction): the waiting jobs, per pool and GPU type (PENDING,
   in the queue of the last scheduling pass: ``queue_position`` set, so neither held nor
   blocked; not stopping, past any requeue backoff); if any, every GPU with its node's
   pool and state, which GPUs a job holds (a slice of it too, or a job still stopping on
   its node), and when each MIG GPU was last asked a layout (its newest ``mig-asked``
   event within the cool-down).
2. *plan*: ``migplan.plan_layouts`` (at most ``max_changes`` GPUs, none within
   ``cooldown_s`` of its last layout).
3. *act*, one GPU per transaction: ``services/miglayouts.set_layout`` as the operator
   ``auto-mig`` with ``idle_only`` (a GPU a job took, or one an operator asked a layout
   for, since step 1 is refused, not drained) and the planner's reason. A refusal or
   an error is logged and counted; the other GPUs go on.

Writes (all through ``set_layout``, the operator's path): the GPU's ``mig_pending``, its
cordon with rule ``mig`` (lifted when the node has applied the layout), a ``mig-asked``
fleet event (actor ``auto-mig``, reason "MIG layout ... (auto-mig: 3 1g.10gb slices
waiting)"), and the wake-up of the node's agent. Nothing else: the node applies the
layout on its next sync, as for an operator's request.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet import mig
from gpufleet.api.maintenance import MigLayoutIn
from gpufleet.clock import Clock
from gpufleet.scheduler import migplan
from gpufleet.server.defaults import NODE_TIMEOUT_S
from gpufleet.server.jobstate.states import JobState
from gpufleet.server.runner import Loop
from gpufleet.server.services import miglayouts
from gpufleet.server.services.auth import Principal
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import Allocation, GpuEvent, GpuRow, Job, NodeRow

log = logging.getLogger("gpufleet.automig")
ACTOR = Principal(user_id=0, name="auto-mig", role="operator")
"""Who asks the layouts: an operator of the server's own (no user row, no token)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoMigConfig:
    """The loop's settings (``ServerConfig.auto_mig_*``)."""

    interval_s: float = 30.0
    cooldown_s: float = migplan.COOLDOWN_S
    """A GPU laid out (by anyone) less than this long ago is left alone."""
    max_changes: int = migplan.MAX_CHANGES
    """GPUs asked a new layout per step, at most."""
    node_timeout_s: float = NODE_TIMEOUT_S
    """A node unseen this long is not ready: its GPUs are left alone."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    """What one step did (the runner ignores it; tests and logs read it)."""

    asked: int = 0
    """Layouts asked this step."""
    refused: int = 0
    """Decisions ``set_layout`` refused (the GPU changed since it was read) or that failed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Observed:
    """The planner's input, as one step read it."""

    waiting: tuple[migplan.Waiting, ...] = ()
    gpus: tuple[migplan.MigGpu, ...] = ()


class AutoMigPass:
    """One step of the loop (``run_once``): observe, plan, ask."""

    def __init__(self, *, db: Database, clock: Clock, config: AutoMigConfig) -> None:
        self.db = db
        self.clock = clock
        self.config = config

    def run_once(self) -> StepResult:
        now = self.clock.now()
        with self.db.read() as s:
            seen = self.observe(s, now)
        decisions = migplan.plan_layouts(
            waiting=seen.waiting,
            gpus=seen.gpus,
            now=now,
            max_changes=self.config.max_changes,
            cooldown_s=self.config.cooldown_s,
        )
        asked = refused = 0
        for d in decisions:
            if self._ask(d, now):
                asked += 1
            else:
                refused += 1
        return StepResult(asked=asked, refused=refused)

    def observe(self, s: Session, now: float) -> Observed:
        """What the planner needs, read in one transaction; nothing but the waiting jobs
        when none waits."""
        waiting = _waiting(s, now)
        if not waiting:
            return Observed()
        return Observed(waiting=waiting, gpus=self._gpus(s, now))

    def _gpus(self, s: Session, now: float) -> tuple[migplan.MigGpu, ...]:
        held = {(node, mig.device_gpu(i)) for node, i in s.execute(_ALLOCATED) if i is not None}
        stopping = {n for nodes in s.scalars(_STOPPING) if nodes for n in nodes.split(",")}
        rows = s.execute(_GPUS).all()
        changed: dict[tuple[str, int], float] = {}
        if any(row[6] for row in rows):  # a GPU in MIG mode: when each was last asked
            q = _LAST_ASKED.where(GpuEvent.at >= now - self.config.cooldown_s)
            changed = {(node, int(i)): float(at) for node, i, at in s.execute(q) if i is not None}
        live_since = now - self.config.node_timeout_s
        out = []
        for row in rows:
            g = _GpuSeen(*row)
            busy = (g.node, g.gpu) in held or g.node in stopping
            out.append(g.planned(held=busy, live_since=live_since, last_changed=changed.get((g.node, g.gpu))))
        return tuple(out)

    def _ask(self, d: migplan.Relayout, now: float) -> bool:
        """One decision in one transaction; False (logged) if refused or failed."""
        spec = MigLayoutIn(layout=list(d.layout)) if d.layout else MigLayoutIn(whole=True)
        what = ",".join(d.layout) or "whole"
        try:
            failed = miglayouts.set_layout(
                db=self.db,
                actor=ACTOR,
                name=d.node,
                index=d.index,
                spec=spec,
                now=now,
                reason=f"auto-mig: {d.reason}",
                idle_only=True,
            )
        except Exception:  # one bad item never stops the step
            log.exception("auto-mig: asking %s/%d for %s failed", d.node, d.index, what)
            return False
        if failed is not None:
            log.info("auto-mig: %s/%d not laid out as %s: %s", d.node, d.index, what, failed.detail)
            return False
        log.info("auto-mig: %s/%d asked for %s (%s)", d.node, d.index, what, d.reason)
        return True


_ALLOCATED = select(Allocation.node, Allocation.gpu_index).where(Allocation.gpu_index.is_not(None))
_STOPPING = select(Job.stopping_on).where(Job.stopping_on.is_not(None))


class _GpuSeen(NamedTuple):
    """A GPU row with its node's, as read (plain tuples: no ORM objects)."""

    node: str
    gpu: int
    model: str
    healthy: bool
    cordoned: bool
    cordon_rule: str | None
    mig_enabled: bool | None
    mig_instances: object
    mig_pending: list[str] | None
    pool: str
    node_cordoned: bool
    last_seen: float | None
    drain_deadline: float | None

    def planned(self, *, held: bool, live_since: float, last_changed: float | None) -> migplan.MigGpu:
        """As the planner sees it: a ``mig`` cordon with no layout pending is a failed
        layout (an operator's); any other cordon, or the agent's unhealthy verdict, is
        out of service; a node not seen since ``live_since``, cordoned or draining is not
        ready."""
        mig_cordon = self.cordoned and self.cordon_rule == miglayouts.RULE
        return migplan.MigGpu(
            node=self.node,
            index=self.gpu,
            pool=self.pool,
            model=self.model,
            mig_enabled=bool(self.mig_enabled),
            layout=_profiles(self.mig_instances) if self.mig_enabled else (),
            held=held,
            pending=None if self.mig_pending is None else tuple(self.mig_pending),
            cordoned=(self.cordoned and not mig_cordon) or not self.healthy,
            ready=(
                not self.node_cordoned
                and self.drain_deadline is None
                and self.last_seen is not None
                and self.last_seen >= live_since
            ),
            failed=mig_cordon and self.mig_pending is None,
            last_changed=last_changed,
        )


_GPUS = select(
    GpuRow.node,
    GpuRow.index,
    GpuRow.model,
    GpuRow.healthy,
    GpuRow.cordoned,
    GpuRow.cordon_rule,
    GpuRow.mig_enabled,
    GpuRow.mig_instances,
    GpuRow.mig_pending,
    NodeRow.pool,
    NodeRow.cordoned,
    NodeRow.last_seen,
    NodeRow.drain_deadline,
).join(NodeRow, NodeRow.name == GpuRow.node)
_LAST_ASKED = (
    select(GpuEvent.node, GpuEvent.gpu_index, func.max(GpuEvent.at))
    .where(GpuEvent.kind == "mig-asked", GpuEvent.gpu_index.is_not(None))
    .group_by(GpuEvent.node, GpuEvent.gpu_index)
)


def _waiting(s: Session, now: float) -> tuple[migplan.Waiting, ...]:
    """Waiting GPU jobs per (pool, GPU type), summed: the queue of the last pass."""
    q = (
        select(Job.pool, Job.gpu_type, func.sum(Job.gpus))
        .where(
            Job.state == str(JobState.PENDING),
            Job.queue_position.is_not(None),
            Job.stopping_on.is_(None),
            Job.not_before.is_(None) | (Job.not_before <= now),
            Job.gpus > 0,
        )
        .group_by(Job.pool, Job.gpu_type)
        .order_by(Job.pool, Job.gpu_type)
    )
    return tuple(migplan.Waiting(pool=p, gpu_type=t, gpus=int(n or 0)) for p, t, n in s.execute(q))


def _profiles(raw: object) -> tuple[str, ...]:
    """The profiles of the instance rows a node sent, by start (a row that names no
    profile and start is skipped, as ``inventory.py`` skips it)."""
    found = [
        (m["start"], m["profile"])
        for m in (raw if isinstance(raw, list) else ())
        if isinstance(m, dict) and isinstance(m.get("start"), int) and isinstance(m.get("profile"), str)
    ]
    return tuple(str(profile) for _, profile in sorted(found))


def automig_loop(*, db: Database, clock: Clock, config: AutoMigConfig) -> Loop:
    """The auto-MIG pass on the common runner, every ``config.interval_s``."""
    return Loop(
        name="auto-mig",
        step=AutoMigPass(db=db, clock=clock, config=config).run_once,
        interval_s=config.interval_s,
    )
