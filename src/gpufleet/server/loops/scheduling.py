"""The scheduling pass: DB -> Snapshot -> ``gpufleet.scheduler.plan`` -> one commit.

It runs in one background thread with synchronous SQLAlchemy (the work is blocking DB
I/O plus a CPU-bound plan, so an asyncio loop would only add hops). A pass runs when
woken (submit, finish, node change) and at least every ``interval_s``. Every decision
about who runs where is the core's: this module builds the snapshot and commits the
plan, nothing else.

Each pass, observe then act (Ray autoscaler's sync/step split):

1. *time limits*: RUNNING jobs past ``started_at + time_limit_s`` -> TIMEOUT at once
   (the server's clock rules; the agent is told to stop them through the sync reply and
   ``stopping_on`` waits for its confirmation). A SCHEDULED job's limit starts when it
   is confirmed RUNNING.
2. *snapshot*: Ready and uncordoned nodes are schedulable (CPU-only nodes too);
   running = SCHEDULED+RUNNING with their allocations (a 0-GPU job: its node, no GPU);
   pending = PENDING jobs not still stopping somewhere, GPU and 0-GPU alike; quotas from
   teams; a hold for every team past its hard budget (``ledger.budgets``). A node
   whose rows the core's model refuses (several GPU models...) is left out
   (``inventory.LiveFleet``; counted in ``skipped_nodes``), never allowed to fail the
   pass: one bad item never stops the loop.
3. *plan* with the configured policy (pure, no DB; this loop's ``PlanCache``).
   Steps 2-3 run outside the write transaction, so a plan never holds the write lock.
4. *commit* in ONE transaction (with step 1): starts (PENDING -> SCHEDULED + allocations),
   preemptions (-> PREEMPTED -> PENDING, GPU-seconds kept, old nodes told to stop), and
   the pending statuses (position, estimated start, reason) and the run times predicted
   for the jobs this pass saw first (``history.py``). Every job write is a
   compare-and-set on (state, version); if one fails the transaction rolls back and the
   pass restarts from a fresh snapshot, at most ``max_attempts`` times (Nomad's plan
   rejection). A failed pass is logged and counted; the loop goes on.

This module is the pass only (``SchedulingPass.run_once``): ``snapshot.py`` reads
(step 2, ``SnapshotReader``) and ``plancommit.py`` writes (steps 1 and 4,
``PlanWriter``). It runs on the common ``runner.Loop`` with a ``StormPacer``, in a
thread or, in ``gpufleet server``, in a child process (``child.py``) so that a pass
over thousands of pending jobs does not hold the API process's GIL. Either way
``PassObserver`` carries what a pass reports (the metrics' ``on_pass``, the nodes it
skipped) to the API process.

At rest (no job that is not finished, no reservation not yet over: nothing the pass
could place, time out, preempt, promote or estimate) a pass that changed nothing lets
the loop sleep until the first live node could turn NotReady (its last sighting +
``node_timeout_s``: the fleet the metrics' fragmentation is of), at most ``idle_s``
(10 s; ``runner.Idle``). What ends the rest is what gives it work, and it wakes the
loop as ever: a submit, a release, a reservation, a node's sync (NOTIFY under HA).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from gpufleet.clock import Clock
from gpufleet.scheduler import Plan, PlanCache, Policy, Snapshot, plan
from gpufleet.server.errors import Conflict
from gpufleet.server.jobstate.preemption import end_graces
from gpufleet.server.jobstate.states import TERMINAL
from gpufleet.server.loops.plancommit import ACTOR, PlanWriter, time_out
from gpufleet.server.loops.snapshot import SnapshotReader
from gpufleet.server.runner import Idle, Loop
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import Job, NodeRow, ReservationRow

log = logging.getLogger("gpufleet.scheduling")


@dataclass(frozen=True, slots=True, kw_only=True)
class PassResult:
    started: int = 0
    preempted: int = 0
    timed_out: int = 0
    waiting: int = 0
    attempts: int = 1


@dataclass(slots=True)
class PassObserver:
    """What the passes report to the API process, wherever they run: the nodes the last
    pass left out and, after each committed pass, ``on_pass(snapshot, plan, seconds)``
    (the metrics; ``server/metrics``). In ``child.py`` mode a reader thread feeds it from
    the child's reports."""

    skipped_nodes: int = 0
    """Nodes the last pass left out (their rows are invalid: ``inventory.py``)."""
    on_pass: Callable[[Snapshot, Plan, float], None] | None = None

    def passed(self, snapshot: Snapshot, plan: Plan, seconds: float) -> None:
        """Tell ``on_pass``; its errors are logged, never raised."""
        if self.on_pass is None:
            return
        try:
            self.on_pass(snapshot, plan, seconds)
        except Exception:
            log.exception("scheduling pass observer failed")


class SchedulingPass:
    """One scheduling pass (``run_once``), retried from fresh state on a lost CAS."""

    def __init__(
        self,
        *,
        db: Database,
        policy: Policy,
        clock: Clock,
        node_timeout_s: float,
        max_attempts: int = 5,
        observer: PassObserver | None = None,
        reservation_idle_release_s: float = 900.0,
        max_preempt_grace_s: float = 120.0,
        interval_s: float = 1.0,
        idle_s: float = 10.0,
    ) -> None:
        self.db = db
        self.policy = policy
        self.clock = clock
        self.node_timeout_s = node_timeout_s
        self.max_attempts = max_attempts
        self.observer = observer or PassObserver()
        self._reader = SnapshotReader()
        self._writer = PlanWriter(idle_release_s=reservation_idle_release_s, max_grace_s=max_preempt_grace_s)
        self._cache = PlanCache()
        """The core's memo from pass to pass (this loop's own: ``scheduler/cache.py``)."""
        self.idle = Idle(interval_s, idle_s)
        """The loop's rest after the last pass (module docstring)."""

    def run_once(self) -> PassResult:
        """One pass; raises ``Conflict`` when every attempt lost a compare-and-set (the
        runner counts it as a failed pass)."""
        t0 = time.perf_counter()
        for attempt in range(1, self.max_attempts + 1):
            now = self.clock.now()
            try:
                with self.db.read() as s:
                    loaded = self._reader.load(s, now, live_since=now - self.node_timeout_s)
                self.observer.skipped_nodes = self._reader.skipped_nodes
                # the collector held off for the pass: 20-30 % faster with 50k pending
                # (``scheduler.core.gc_paused``); this loop owns its thread or process
                result = plan(loaded.snapshot, self.policy, explain=True, cache=self._cache, pause_gc=True)
                with self.db.write() as s:
                    timed_out = time_out(s, now)
                    end_graces(s, now, actor=ACTOR)  # preemptions whose victims' grace is over
                    started = self._writer.commit(s, loaded, result, now)
                    self._reader.predictions.write(s)  # the jobs first seen this pass (``history.py``)
            except (Conflict, IntegrityError, OperationalError) as exc:
                log.info("scheduling pass attempt %d rejected (%s); retrying", attempt, type(exc).__name__)
                self._writer.forget()
                self._reader.forget()
                continue
            self._reader.predictions.written()
            snap = loaded.snapshot
            if snap.pending or snap.running or snap.reservations or started or timed_out:
                self.idle.busy()
            else:
                with self.db.read() as s:
                    self.idle.until(self._due_in(s, now))
            self.observer.passed(snap, result, time.perf_counter() - t0)
            return PassResult(
                started=started,
                preempted=len(result.preemptions),
                timed_out=timed_out,
                waiting=len(result.pending),
                attempts=attempt,
            )
        raise Conflict(f"scheduling pass gave up after {self.max_attempts} attempts")

    def _due_in(self, s: Session, now: float) -> float | None:
        """How long the loop may rest after a pass that placed nothing: 0 (one interval)
        while any job is not finished or any reservation is not over, else until the
        first live node could turn NotReady (None: no live node)."""
        if s.scalar(select(Job.id).where(Job.state.not_in(TERMINAL)).limit(1)) is not None:
            return 0.0
        if s.scalar(select(ReservationRow.id).where(ReservationRow.end > now).limit(1)) is not None:
            return 0.0
        live_since = now - self.node_timeout_s
        first: float | None = s.scalar(
            select(func.min(NodeRow.last_seen)).where(NodeRow.last_seen >= live_since)
        )
        return None if first is None else first + self.node_timeout_s - now + 0.05


class StormPacer:
    """Passes back to back would starve the API under a stream of wake-ups, so once
    passes run back to back (woken again while running, twice in a row) the loop rests
    ``busy_factor * d`` after a pass of d seconds (at most ``max_rest_s``, the interval):
    it then takes at most 1/(1+busy_factor) of the process (of a core, in the child
    process). Short passes under a submit storm (a short queue) would still run dozens
    of times a second, each reading the fleet: passes then start at most every
    ``storm_gap_s``. An occasional wake-up is served at once.

    A storm ends only after a quiet spell: a pass that starts ``storm_gap_s`` or more
    after the previous one ended, with no wake-up during the rest before it, and is not
    woken while it runs. On a busy machine the submitters may not get the CPU during one
    short pass, and that alone must not let the next pass run straight after it."""

    def __init__(self, *, max_rest_s: float, busy_factor: float = 4.0, storm_gap_s: float = 0.05) -> None:
        self.max_rest_s = max_rest_s
        self.busy_factor = busy_factor
        self.storm_gap_s = storm_gap_s
        self._streak = 0
        self._last_end = -math.inf
        self._woken_resting = False

    def rest_after(self, *, started: float, ended: float, woken: bool) -> float:
        quiet = not self._woken_resting and started - self._last_end >= self.storm_gap_s
        self._woken_resting = False
        self._last_end = ended
        if woken:
            self._streak += 1
        elif quiet:
            self._streak = 0
        if self._streak < 2:
            return 0.0
        took = ended - started
        return min(self.max_rest_s, max(self.busy_factor * took, self.storm_gap_s - took))

    def rested(self, *, woken: bool) -> None:
        self._woken_resting = woken


def scheduling_loop(step: SchedulingPass, *, interval_s: float) -> Loop:
    """The scheduling pass on the common runner, paced against wake-up storms."""
    return Loop(
        name="scheduling",
        step=step.run_once,
        interval_s=interval_s,
        first_after_s=0.0,
        pacer=StormPacer(max_rest_s=interval_s),
        rest=step.idle,
    )
