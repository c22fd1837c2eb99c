"""The node-lifecycle loop: moves work off lost nodes and bad GPUs, runs drains and
rolling maintenance. One background thread, a pass every ``interval_s`` (sooner when a
health rule fires). Each pass observes first (nodes, sightings, health findings), then
acts, one item per transaction (a job's requeue is written with its job events and the
``gpu_events`` row); one bad item is logged and counted, never fatal.

Transitions it makes:

- node unseen for ``node_timeout_s`` -> NotReady (derived from ``last_seen``: nothing
  new lands on it; no write);
- NotReady for ``requeue_after_s`` more -> *lost*: ``lost_at`` set, each job holding
  GPUs there requeued (``requeue.py``: the lost node needs no stop confirmation; live
  nodes of a multi-node job do), the node removed from every ``stopping_on``, a
  critical event. A server (re)start counts as a sighting of every node, so a server
  that was down longer than that does not declare its whole fleet lost;
- a lost node seen again -> back (``lost_at`` cleared); its agent is told, through the
  sync reply, to stop the attempts the server requeued;
- a health rule fired (``health.py``) -> that GPU cordoned, its job requeued, a critical
  event; a ``temperature`` cordon is lifted after ``recover_after_s`` of normal readings;
- draining node past its deadline (or ``--requeue``) -> its jobs requeued; a draining node
  without jobs is drained;
- an active rollout keeps ``max_unavailable`` of its nodes draining/drained and finishes
  when each of them was uncordoned or marked done;
- an open driver upgrade (``services/upgrades.py``): a waiting node starts draining while
  fewer than ``max_unavailable`` are out, a drained one is ordered upgraded (or waits
  for the operator), one node per transaction; the upgrade is done once every node is.

At rest (``idle_s`` > interval: a single server, SQLite) a pass that found nothing in
flight (no lost node, no drain, no recoverable cordon, no open rollout or upgrade, no
finding, nothing changed) lets the loop sleep until the first node could be declared
lost (its last sighting + ``node_timeout_s`` + ``requeue_after_s``), at most
``idle_s``; every other transition is announced by a wake-up (a health finding, a
drain, rollout or upgrade started or moved by a request: ``effects.wake_lifecycle``).
Under HA (PostgreSQL) those requests may land on another server, whose wake-ups reach
only its own monitor: the leader's loop keeps its pass every interval.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from gpufleet.clock import Clock
from gpufleet.server.decide.health import RECOVERABLE, Finding, HealthMonitor
from gpufleet.server.defaults import NODE_TIMEOUT_S, REQUEUE_AFTER_S
from gpufleet.server.errors import Conflict
from gpufleet.server.loops import health as gpu_health
from gpufleet.server.runner import Idle, Loop
from gpufleet.server.services import nodeops, upgrades
from gpufleet.server.store import effects
from gpufleet.server.store.agentstate import AgentState
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import Allocation, GpuRow, Job, NodeRow, Rollout, RolloutNode

log = logging.getLogger("gpufleet.lifecycle")
ACTOR = "lifecycle"


@dataclass(frozen=True, slots=True, kw_only=True)
class LifecycleConfig:
    node_timeout_s: float = NODE_TIMEOUT_S
    requeue_after_s: float = REQUEUE_AFTER_S
    interval_s: float = 1.0
    idle_s: float = 1.0
    """The longest rest after a pass with nothing in flight (module docstring)."""


@dataclass(slots=True)
class PassStats:
    lost: int = 0
    back: int = 0
    cordoned: int = 0
    recovered: int = 0
    changes: int = 0
    errors: int = 0


class LifecyclePass:
    """One lifecycle pass (``run_once``); runs on the common ``runner.Loop``, woken by
    the health monitor when a rule fires and by maintenance requests."""

    def __init__(
        self,
        *,
        db: Database,
        hot: AgentState,
        clock: Clock,
        config: LifecycleConfig,
    ) -> None:
        self.db = db
        self.hot = hot
        self.clock = clock
        self.config = config
        self.started_at = clock.now()
        self.item_errors = 0
        """Items that failed (logged); the pass itself went on."""
        self.idle = Idle(config.interval_s, config.idle_s)
        """The loop's rest after the last pass (``runner.Idle``)."""

    @property
    def monitor(self) -> HealthMonitor:
        return self.hot.health

    # -- one pass -------------------------------------------------------------------------------
    def run_once(self) -> PassStats:
        now = self.clock.now()
        stats = PassStats()
        seen = self.hot.heartbeats.latest()  # before the DB read: a flush in between is then in the DB
        findings = self.monitor.take()
        with self.db.read() as s:
            # plain rows, not ORM objects: this runs every second over every node (with a
            # thousand nodes, loading NodeRow objects was a tenth of a core and held the
            # GIL long enough to show in the agents' sync latency)
            nodes = s.execute(
                select(NodeRow.name, NodeRow.last_seen, NodeRow.lost_at, NodeRow.drain_deadline).order_by(
                    NodeRow.name
                )
            ).all()
            recoverable = list(
                s.scalars(
                    select(GpuRow).where(GpuRow.cordoned.is_(True), GpuRow.cordon_rule.in_(RECOVERABLE))
                )
            )
            rollout = s.scalar(select(Rollout.id).where(Rollout.state.in_(upgrades.OPEN)).limit(1))
        lost_after = self.config.node_timeout_s + self.config.requeue_after_s
        for n in nodes:
            sighted = max(n.last_seen or 0.0, seen.get(n.name, 0.0))
            last = max(sighted, self.started_at)  # a (re)start of the server counts as a sighting
            if n.lost_at is None and last < now - lost_after:
                self._item(stats, "lost", self._declare_lost, n.name, now, last)
            elif n.lost_at is not None and sighted > n.lost_at:
                self._item(stats, "back", self._back, n.name, now)
            elif n.lost_at is not None:
                self._item(stats, None, self._release_stops, n.name)
        failed: dict[tuple[str, int], list[Finding]] = {}
        for (node, idx), found in sorted(findings.items()):
            if not self._item(stats, "cordoned", gpu_health.cordon_gpu, node, idx, found, now):
                failed[(node, idx)] = found
        if failed:
            self.monitor.put_back(failed)
        for g in recoverable:
            if self.monitor.cool_for(g.node, g.index, now) >= self.monitor.rules.recover_after_s:
                self._item(stats, "recovered", gpu_health.recover_gpu, g.node, g.index, now, self.monitor)
        for n in nodes:
            if n.drain_deadline is not None:
                self._item(stats, None, self._drain_step, n.name, now)
        self._item(stats, None, self._rollout_step, now)
        self._upgrades(stats, now)
        quiet = not (findings or recoverable or rollout is not None or stats.changes or stats.errors) and all(
            n.lost_at is None and n.drain_deadline is None for n in nodes
        )
        if quiet:  # the next thing that falls due unannounced: a node declared lost
            due = [
                max(n.last_seen or 0.0, seen.get(n.name, 0.0), self.started_at) + lost_after for n in nodes
            ]
            self.idle.until(min(due) - now + 0.05 if due else None)
        else:
            self.idle.busy()
        return stats

    def _upgrades(self, stats: PassStats, now: float) -> None:
        """The open driver upgrade (``services/upgrades.py``): each node that may move,
        in its own transaction, then whether it is done."""
        with self.db.read() as s:
            todo = upgrades.steps(s)
        for rollout_id, node in todo:
            self._item(stats, None, upgrades.advance, rollout_id, node, now)
        self._item(stats, None, upgrades.finish, now)

    def _item(self, stats: PassStats, counter: str | None, fn: Callable[..., int], *args: object) -> bool:
        """One item in its own transaction (retried on a lost CAS); never raises. An item
        that changed something drops the fleet caches and wakes the scheduler once it has
        committed (``effects.py``)."""
        for _ in range(5):
            try:
                with self.db.write() as s:
                    changed = fn(s, *args)
                    if changed:
                        effects.invalidate_fleets(s)
                        effects.wake_scheduler(s)
            except (Conflict, OperationalError):
                continue
            except Exception:
                stats.errors += 1
                self.item_errors += 1
                log.exception("lifecycle: %s%r failed", getattr(fn, "__name__", fn), args)
                return False
            if counter is not None and changed:
                setattr(stats, counter, getattr(stats, counter) + 1)
            stats.changes += changed
            return True
        stats.errors += 1
        return False

    # -- node lifecycle -------------------------------------------------------------------------
    def _declare_lost(self, s: Session, name: str, now: float, last: float) -> int:
        node = s.get(NodeRow, name)
        if node is None or node.lost_at is not None:
            return 0
        node.lost_at = now
        reason = f"node {name} lost: unseen for {now - last:.0f} s"
        n = nodeops.requeue_on(s, node=name, now=now, actor=ACTOR, reason=reason, lost=True)
        self._release_stops(s, name)
        nodeops.add_event(
            s,
            at=now,
            node=name,
            kind="node_lost",
            severity="critical",
            actor=ACTOR,
            reason=f"{reason}; {n} job(s) requeued",
        )
        log.warning("%s; %d job(s) requeued", reason, n)
        return 1

    def _release_stops(self, s: Session, name: str) -> int:
        """A lost node confirms nothing: stop waiting for it."""
        q = select(Job).where(Job.stopping_on.is_not(None), Job.stopping_on.contains(name))
        n = 0
        for job in s.scalars(q):
            waiting = job.stopping_nodes
            if name in waiting:  # ``contains`` also finds a name that holds this one
                job.stopping_nodes = [x for x in waiting if x != name]
                n += 1
        return n

    def _back(self, s: Session, name: str, now: float) -> int:
        node = s.get(NodeRow, name)
        if node is None or node.lost_at is None:
            return 0
        nodeops.add_event(
            s,
            at=now,
            node=name,
            kind="node_back",
            severity="info",
            actor=ACTOR,
            reason=f"node {name} seen again after being lost at {node.lost_at:.0f}",
        )
        node.lost_at = None
        return 1

    # -- drains and rollouts --------------------------------------------------------------------
    def _drain_step(self, s: Session, name: str, now: float) -> int:
        node = s.get(NodeRow, name)
        if node is None or node.drain_deadline is None:
            return 0
        if node.drain_requeue or now >= node.drain_deadline:
            return nodeops.requeue_on(s, node=name, now=now, actor=ACTOR, reason=f"node {name} drained")
        return 0

    def _rollout_step(self, s: Session, now: float) -> int:
        ro = s.scalar(
            select(Rollout)
            .where(Rollout.state == "active", Rollout.expect_driver.is_(None))
            .order_by(Rollout.id)
            .limit(1)
        )
        if ro is None:
            return 0
        members = list(
            s.scalars(
                select(RolloutNode).where(RolloutNode.rollout_id == ro.id).order_by(RolloutNode.position)
            )
        )
        busy = set(s.scalars(select(Allocation.node).distinct()))
        changed = 0
        for m in members:
            if m.state == "draining" and m.node not in busy:
                m.state = "drained"
                nodeops.add_event(
                    s,
                    at=now,
                    node=m.node,
                    kind="node_drained",
                    severity="info",
                    actor=ACTOR,
                    reason=f"rollout {ro.id}: node {m.node} drained; upgrade it, then uncordon it",
                )
                changed += 1
        unavailable = sum(1 for m in members if m.state in ("draining", "drained"))
        for m in members:
            if unavailable >= ro.max_unavailable:
                break
            if m.state != "waiting":
                continue
            node = s.get(NodeRow, m.node)
            if node is None:
                m.state, m.finished_at = "done", now
                continue
            nodeops.start_drain(
                s,
                node,
                now=now,
                grace_s=ro.grace_s,
                requeue=ro.requeue,
                reason=f"rollout {ro.id}: {ro.reason}",
                actor=ACTOR,
            )
            m.state, m.started_at = "draining", now
            unavailable += 1
            changed += 1
        if all(m.state == "done" for m in members):
            ro.state, ro.finished_at = "done", now
            changed += 1
        return changed


def lifecycle_loop(step: LifecyclePass) -> Loop:
    """The lifecycle pass on the common runner; the health monitor wakes it. That wake is
    direct, not an after-commit effect (``effects.py``): a fresh finding is in memory,
    there is no commit to wait for (a drain or rollout started by a request wakes it
    through ``effects.wake_lifecycle``, whose hook is ``HealthMonitor.poke``)."""
    loop = Loop(name="lifecycle", step=step.run_once, interval_s=step.config.interval_s, rest=step.idle)
    step.monitor.waker = loop.wake
    return loop
