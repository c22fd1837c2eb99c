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
   the pending statuses (position, estimated start, reason). Every job write is a
   compare-and-set on (state, version); if one fails the transaction rolls back and the
   pass restarts from a fresh snapshot, at most ``max_attempts`` times (Nomad's plan
   rejection). A failed pass is logged and counted; the loop goes on.

This module is the pass only (``SchedulingPass.run_once``); it runs on the common
``runner.Loop`` with a ``StormPacer``, in a thread or, in ``gpufleet server``, in a
child process (``child.py``) so that a pass over thousands of pending jobs does not
hold the API process's GIL. Either way ``PassObserver`` carries what a pass reports
(the metrics' ``on_pass``, the nodes it skipped) to the API process.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from gpufleet import mig
from gpufleet.clock import Clock
from gpufleet.mig import SLICE_BASE
from gpufleet.placefmt import placed_reason
from gpufleet.scheduler import (
    Blocked,
    Hold,
    JobRequest,
    NodeGpus,
    Plan,
    PlanCache,
    Policy,
    QosLimit,
    Quota,
    RunningJob,
    Snapshot,
    plan,
)
from gpufleet.server.errors import Conflict
from gpufleet.server.jobstate.states import ACTIVE, JobState
from gpufleet.server.jobstate.transitions import JobRef, move, ref, release_attempt
from gpufleet.server.loops import dependencies, eligibility
from gpufleet.server.loops.reservations import Booked, load_booked, step_reservations
from gpufleet.server.runner import Loop
from gpufleet.server.services import layoutwait
from gpufleet.server.services.inventory import LiveFleet
from gpufleet.server.store import ledger
from gpufleet.server.store.db import Database
from gpufleet.server.store.dispatch import touch
from gpufleet.server.store.models import Allocation, Job, LicenseRow, QosRow, ServiceRow, Team, User

log = logging.getLogger("gpufleet.scheduling")
ACTOR = "scheduler"
_STATES = {str(st): st for st in JobState}


class _JobRow(NamedTuple):
    """The columns of a job that a pass reads, loaded as a tuple: ORM objects (with
    their JSON ``command`` and ``env``) were over half of a pass with thousands of
    pending jobs."""

    id: int
    state: str
    version: int
    gpus: int
    submit_time: float
    user_id: int
    team_id: int
    priority: int
    gpus_per_node: int
    nodes: int
    gpu_type: str | None
    pool: str
    time_limit_s: float | None
    attained_service_s: float
    executed_s: float
    pending_since: float | None
    requeue: bool
    reservation_id: int | None
    started_at: float | None
    scheduled_at: float | None
    service_id: int | None
    name: str
    array_job_id: int | None
    array_limit: int
    dependency: str | None
    kill_on_invalid_dep: bool
    cpus_per_node: int
    mem_per_node_mb: int
    begin_at: float | None
    deadline: float | None
    max_price: float | None
    constraint: str | None
    exclude: list[str] | None
    qos: str | None
    licenses: dict[str, int] | None

    def ref(self) -> JobRef:
        return JobRef(id=self.id, state=_STATES[self.state], version=self.version)


_JOB_COLUMNS = select(*(getattr(Job, name) for name in _JobRow._fields))
_FULL_RELOAD = 500
"""More new or changed pending jobs than this: read the whole queue in one statement
instead of those by id."""


def _pending_where(now: float) -> tuple[Any, ...]:
    return (
        Job.state == str(JobState.PENDING),
        Job.stopping_on.is_(None),
        Job.not_before.is_(None) | (Job.not_before <= now),  # a requeue's backoff
    )


@dataclass(slots=True)
class _PendingCache:
    """The pending jobs of the last pass, by id: a job's row, its CAS ref and (once
    built) its ``JobRequest``. Every write that changes a column a pass reads bumps the
    job's version (``transitions.move``; the positions a pass writes are not read back),
    so a pass reads only ids and versions of the queue, then the rows of jobs that are
    new or changed: with thousands of jobs waiting, building their rows and requests was
    most of a pass's load. Requests carry user and team names: all are rebuilt when
    those change."""

    rows: dict[int, tuple[_JobRow, JobRef, JobRequest | None]] = field(default_factory=dict)
    names: tuple[dict[int, str], dict[int, str], QosTerms] = field(default_factory=lambda: ({}, {}, {}))

    def load(self, s: Session, now: float) -> list[tuple[_JobRow, JobRef, JobRequest | None]]:
        """The queue in id order (a job that changed between the two reads sits this
        pass out: it is changing anyway, and the next pass reads it again)."""
        where = _pending_where(now)
        keys = s.execute(select(Job.id, Job.version).where(*where).order_by(Job.id)).all()
        old = self.rows
        stale = [jid for jid, version in keys if (hit := old.get(jid)) is None or hit[0].version != version]
        if stale:
            q = _JOB_COLUMNS.where(*where)
            if len(stale) <= _FULL_RELOAD:
                q = q.where(Job.id.in_(stale))
            for row in s.execute(q):
                hit = old.get(row[0])
                if hit is None or hit[0].version != row[2]:  # (a whole-queue read: or unchanged)
                    job = _JobRow(*row)
                    old[job.id] = (job, job.ref(), None)
        self.rows = {}
        out = []
        for jid, version in keys:
            hit = old.get(jid)
            if hit is not None and hit[0].version == version:
                self.rows[jid] = hit
                out.append(hit)
        return out

    def request(self, jid: int, teams: dict[int, str], users: dict[int, str], qos: QosTerms) -> JobRequest:
        job, jref, req = self.rows[jid]
        if req is None:
            req = _request(job, teams, users, qos)
            self.rows[jid] = (job, jref, req)
        return req

    def check_names(self, teams: dict[int, str], users: dict[int, str], qos: QosTerms) -> None:
        if (teams, users, qos) != self.names:
            self.rows = {jid: (job, jref, None) for jid, (job, jref, _) in self.rows.items()}
            self.names = (teams, users, qos)

    def clear(self) -> None:
        self.rows = {}


@dataclass(frozen=True, slots=True, kw_only=True)
class PassResult:
    started: int = 0
    preempted: int = 0
    timed_out: int = 0
    waiting: int = 0
    attempts: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class _Loaded:
    snapshot: Snapshot
    refs: dict[str, JobRef]
    booked: list[Booked] = field(default_factory=list)
    kill: dict[int, str] = field(default_factory=dict)
    """Waiting jobs this pass cancels, and why: a dependency that can never be
    satisfied (with ``kill_on_invalid_dep``), a deadline that can no longer be met."""


@dataclass(slots=True)
class _StatusCache:
    """Last written PendingStatus per job, so a pass writes only what changed."""

    rows: dict[int, tuple[int | None, float | None, str | None]] = field(default_factory=dict)


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
    ) -> None:
        self.db = db
        self.policy = policy
        self.clock = clock
        self.node_timeout_s = node_timeout_s
        self.max_attempts = max_attempts
        self.observer = observer or PassObserver()
        self.reservation_idle_release_s = reservation_idle_release_s
        self._statuses = _StatusCache()
        self._fleet = LiveFleet()
        self._pending = _PendingCache()
        self._cache = PlanCache()
        """The core's memo from pass to pass (this loop's own: ``scheduler/cache.py``)."""

    def run_once(self) -> PassResult:
        """One pass; raises ``Conflict`` when every attempt lost a compare-and-set (the
        runner counts it as a failed pass)."""
        t0 = time.perf_counter()
        for attempt in range(1, self.max_attempts + 1):
            now = self.clock.now()
            try:
                with self.db.read() as s:
                    loaded = self._load(s, now)
                # the collector held off for the pass: 20-30 % faster with 50k pending
                # (``scheduler.core.gc_paused``); this loop owns its thread or process
                result = plan(loaded.snapshot, self.policy, explain=True, cache=self._cache, pause_gc=True)
                with self.db.write() as s:
                    timed_out = self._time_limits(s, now)
                    started = self._commit(s, loaded, result, now)
            except (Conflict, IntegrityError, OperationalError) as exc:
                log.info("scheduling pass attempt %d rejected (%s); retrying", attempt, type(exc).__name__)
                self._statuses.rows.clear()
                self._pending.clear()
                continue
            self.observer.passed(loaded.snapshot, result, time.perf_counter() - t0)
            return PassResult(
                started=started,
                preempted=len(result.preemptions),
                timed_out=timed_out,
                waiting=len(result.pending),
                attempts=attempt,
            )
        raise Conflict(f"scheduling pass gave up after {self.max_attempts} attempts")

    def _time_limits(self, s: Session, now: float) -> int:
        q = select(Job).where(
            Job.state == str(JobState.RUNNING),
            Job.time_limit_s.is_not(None),
            Job.started_at.is_not(None),
            Job.started_at + Job.time_limit_s <= now,
        )
        n = 0
        for job in s.scalars(q):
            vals = release_attempt(s, job, now=now, confirmed=False)
            reason = f"time limit {job.time_limit_s:g}s reached"
            move(s, ref(job), JobState.TIMEOUT, actor=ACTOR, reason=reason, now=now, values=vals)
            n += 1
        return n

    def _load(self, s: Session, now: float) -> _Loaded:
        fleet = self._fleet.load(s, live_since=now - self.node_timeout_s)
        self.observer.skipped_nodes = len(self._fleet.skipped)
        teams = dict(s.execute(select(Team.id, Team.name)).all())
        users = dict(s.execute(select(User.id, User.name)).all())
        quotas = tuple(
            Quota(team=t.name, gpus=t.quota_gpus, limit=t.quota_limit)
            for t in s.scalars(select(Team).where(Team.quota_gpus.is_not(None)))
            if t.quota_gpus is not None
        )
        qos_rows = list(s.scalars(select(QosRow)))
        qos: QosTerms = {q.name: (q.priority, q.preemptable) for q in qos_rows}
        limits = tuple(
            QosLimit(
                name=q.name, max_gpus_per_user=q.max_gpus_per_user, max_jobs_per_user=q.max_jobs_per_user
            )
            for q in qos_rows
        )
        declared = tuple((n, c) for n, c in s.execute(select(LicenseRow.name, LicenseRow.count)).tuples())
        refs: dict[str, JobRef] = {}
        placements: dict[int, dict[str, list[int]]] = {}
        q = select(Allocation.job_id, Allocation.node, Allocation.gpu_index)
        slices = self._fleet.slices
        for jid, node, idx in s.execute(q):
            if idx is not None and idx >= SLICE_BASE:  # a MIG slice or GPU share: its node, to the core
                share = mig.share_of(idx)
                if share is not None:
                    node = mig.share_node(node, share[0])
                else:
                    node = slices.get((node, idx), mig.slice_node(node, "?"))
            held_here = placements.setdefault(jid, {}).setdefault(node, [])
            if idx is not None:  # a 0-GPU job's row: its node, no GPU
                held_here.append(idx)
        running: list[RunningJob] = []
        active = [str(a) for a in ACTIVE]
        for row in s.execute(_JOB_COLUMNS.where(Job.state.in_(active))):
            job = _JobRow(*row)
            refs[str(job.id)] = job.ref()
            parts = placements.get(job.id, {})
            running.append(
                RunningJob(
                    job=_request(job, teams, users, qos),
                    placement=tuple(
                        NodeGpus(node=n, gpus=tuple(sorted(g))) for n, g in sorted(parts.items())
                    ),
                    started_at=job.started_at or job.scheduled_at or now,
                )
            )
        pending: list[JobRequest] = []
        holds = tuple(
            Hold(team=teams[tid], reason=b.hold_reason())
            for tid, b in sorted(ledger.budgets(s, now).items())
            if b.over_hard and tid in teams
        )
        self._pending.check_names(teams, users, qos)
        waiting: list[dependencies.Waiting] = []
        timed: list[eligibility.Timed] = []
        for job, jref, req in self._pending.load(s, now):
            refs[str(job.id)] = jref
            pending.append(req if req is not None else self._pending.request(job.id, teams, users, qos))
            if job.dependency is not None:
                w = dependencies.Waiting(
                    id=job.id, user_id=job.user_id, name=job.name, dependency=job.dependency
                )
                waiting.append(w)
            if job.begin_at is not None or job.deadline is not None or job.max_price is not None:
                timed.append(_timed(job))
        kill: dict[int, str] = {}
        held_back: dict[int, Blocked] = {}
        if timed:  # judged every pass: the clock moves
            prices = ledger.schedule_in_force(s) if any(t.max_price is not None for t in timed) else None
            models: dict[str, list[str]] = {}
            for n in fleet.nodes:
                if n.gpus and n.model not in models.setdefault(n.pool, []):
                    models[n.pool].append(n.model)
            held_back, kill = eligibility.judge(
                timed, now=now, schedule=None if prices is None else prices[0], pool_models=models
            )
        if any(mig.wants_slices(p.gpu_type) for p in pending):  # slices a pending MIG layout makes
            for jid, b in layoutwait.judge(pending, fleet=fleet, awaited=layoutwait.load(s)).items():
                held_back.setdefault(jid, b)
        if waiting:  # judged every pass: a verdict changes when another job ends
            for jid, b in dependencies.blocked(s, waiting).items():
                if b.never and self._pending.rows[jid][0].kill_on_invalid_dep:
                    kill[jid] = f"{b.code}: {b.detail} (kill_on_invalid_dep)"
                later = held_back.get(jid)
                held_back[jid] = b if later is None else replace(b, not_before=later.not_before)
        if held_back or kill:
            pending = [
                replace(p, blocked=hb) if (hb := held_back.get(int(p.id))) else p
                for p in pending
                if int(p.id) not in kill
            ]
        booked = load_booked(s, now)
        snap = Snapshot(
            now=now,
            fleet=fleet,
            running=tuple(running),
            pending=tuple(pending),
            quotas=quotas,
            reservations=tuple(b.core for b in booked),
            holds=holds,
            qos=limits,
            licenses=declared,
        )
        return _Loaded(snapshot=snap, refs=refs, booked=booked, kill=kill)

    def _commit(self, s: Session, loaded: _Loaded, result: Plan, now: float) -> int:
        services = _services_of(s, {int(p.by) for p in result.preemptions if p.by.isdigit()})
        for pre in result.preemptions:
            jref = loaded.refs[pre.job_id]
            job = s.get(Job, jref.id)
            assert job is not None
            vals = release_attempt(s, job, now=now, confirmed=False)
            vals |= {"ended_at": None, "pending_since": now, "scheduled_at": None, "started_at": None}
            move(
                s,
                jref,
                JobState.PENDING,
                via=JobState.PREEMPTED,
                actor=ACTOR,
                reason=pre.reason + services.get(pre.by, ""),
                now=now,
                values=vals,
            )
        allocs: list[dict[str, Any]] = []
        models = {n.name: n.gpus[0].model for n in loaded.snapshot.fleet.nodes if n.gpus and result.starts}
        for st in result.starts:
            jref = loaded.refs[st.job_id]
            first = st.placement[0]  # one model per node, per job
            vals = {
                "scheduled_at": now,
                "queue_position": None,
                "estimated_start": None,
                "wait_reason": None,
            }
            if first.gpus:  # cost accrues from here (``ledger.py``) at the price of this model
                vals |= {"accrued_to": now, "charge_model": models[first.node]}
            move(
                s,
                jref,
                JobState.SCHEDULED,
                actor=ACTOR,
                reason=placed_reason(
                    [(mig.physical_node(p.node), p.gpus) for p in st.placement], how=result.policy
                ),
                now=now,
                values=vals,
            )
            allocs += [
                {"job_id": jref.id, "node": mig.physical_node(p.node), "gpu_index": g}
                for p in st.placement
                for g in (p.gpus or (None,))  # a 0-GPU job: one row for its node
            ]
            self._statuses.rows.pop(jref.id, None)
        for jid, why in loaded.kill.items():
            ended = {"ended_at": now}
            move(s, loaded.refs[str(jid)], JobState.CANCELLED, actor=ACTOR, reason=why, now=now, values=ended)
            self._statuses.rows.pop(jid, None)
        if allocs:
            s.execute(insert(Allocation), allocs)
            touch(s, {a["node"] for a in allocs})  # their agents learn at the commit (``dispatch.py``)
        self._write_statuses(s, result)
        step_reservations(
            s,
            booked=loaded.booked,
            running=loaded.snapshot.running,
            moves=result.reservation_moves,
            now=now,
            idle_release_s=self.reservation_idle_release_s,
            actor=ACTOR,
        )
        return len(result.starts)

    def _write_statuses(self, s: Session, result: Plan) -> None:
        rows: list[dict[str, Any]] = []
        views = [
            (
                int(p.job_id),
                p.position,
                None if p.estimated_start is None else round(p.estimated_start, 1),
                p.reason,
            )
            for p in result.pending
        ]
        for jid, pos, eta, reason in views:
            val = (pos, eta, reason[:512])
            if self._statuses.rows.get(jid) != val:
                rows.append(
                    {"id": jid, "queue_position": val[0], "estimated_start": val[1], "wait_reason": val[2]}
                )
                self._statuses.rows[jid] = val
        if rows:
            # Positions are advisory and not part of the CAS: they do not bump the version.
            s.execute(update(Job), rows)


def _services_of(s: Session, job_ids: set[int]) -> dict[str, str]:
    """For preemptions by replicas of inference services: job id -> what to add to the
    victim's reason (``; a replica of service NAME``), so the plan says why."""
    if not job_ids:
        return {}
    q = (
        select(Job.id, ServiceRow.name)
        .join(ServiceRow, ServiceRow.id == Job.service_id)
        .where(Job.id.in_(job_ids))
    )
    return {str(jid): f"; a replica of service {name}" for jid, name in s.execute(q)}


def _timed(job: _JobRow) -> eligibility.Timed:
    return eligibility.Timed(
        id=job.id,
        begin_at=job.begin_at,
        deadline=job.deadline,
        max_price=job.max_price,
        time_limit_s=job.time_limit_s,
        gpu_type=job.gpu_type,
        pool=job.pool,
        priority=job.priority,
    )


QosTerms = dict[str, tuple[int, bool]]
"""QOS name -> (its priority, whether its jobs may be preempted)."""


def _request(job: _JobRow, teams: dict[int, str], users: dict[int, str], qos: QosTerms) -> JobRequest:
    """The core's view of ``job``; its QOS's priority is added to its own (within the
    API's -1000..1000) and a QOS that is not preemptable makes it a non-victim."""
    boost, preemptable = qos.get(job.qos, (0, True)) if job.qos is not None else (0, True)
    return JobRequest(
        id=str(job.id),
        gpus=job.gpus,
        submit_time=job.submit_time,
        user=users.get(job.user_id, ""),
        team=teams.get(job.team_id, ""),
        priority=max(-1000, min(1000, job.priority + boost)),
        gpus_per_node=job.gpus_per_node,
        nodes=job.nodes,
        gpu_type=job.gpu_type,
        pool=job.pool,
        time_limit_s=job.time_limit_s,
        attained_service_s=job.attained_service_s,
        executed_s=job.executed_s,
        pending_since=job.pending_since,
        # An inference replica is never a victim: a service's traffic would fail.
        preemptible=job.requeue and job.service_id is None and preemptable,
        reservation=None if job.reservation_id is None else str(job.reservation_id),
        spread=None if job.service_id is None else f"service:{job.service_id}",
        array=None if job.array_job_id is None else str(job.array_job_id),
        array_limit=job.array_limit or 0,
        cpus=job.cpus_per_node or 0,
        mem_mb=job.mem_per_node_mb or 0,
        constraint=job.constraint,
        exclude=frozenset(job.exclude or ()),
        qos=job.qos,
        licenses=tuple(sorted(job.licenses.items())) if job.licenses else (),
    )


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
    )
