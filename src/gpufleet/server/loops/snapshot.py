"""The scheduling pass's read (step 2 of ``scheduling.py``): the database as the core's
``Snapshot``, read outside the write transaction so that a plan never holds the write lock.

Ready and uncordoned nodes are schedulable (CPU-only nodes too); running =
SCHEDULED+RUNNING with their allocations (a 0-GPU job: its node, no GPU); pending =
PENDING jobs not still stopping somewhere, GPU and 0-GPU alike; quotas from teams; a hold
for every team past its hard budget (``ledger.budgets``). A node whose rows the core's
model refuses (several GPU models...) is left out (``inventory.LiveFleet``; counted in
``skipped_nodes``), never allowed to fail the pass: one bad item never stops the loop.
Waiting jobs are judged here too (``dependencies``, ``eligibility``, ``layoutwait``):
held back with their reasons, or cancelled by the commit (``Loaded.kill``).

``SnapshotReader`` keeps what need not be read again from pass to pass: the fleet's rows
and the pending jobs' rows and requests (``_PendingCache``), and the run-time predictor
fed from the jobs that ended with each job's prediction (``history.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet import mig
from gpufleet.cudaver import parse_reported
from gpufleet.mig import SLICE_BASE
from gpufleet.scheduler import (
    Blocked,
    Hold,
    JobRequest,
    NodeGpus,
    QosLimit,
    Quota,
    RunningJob,
    Snapshot,
)
from gpufleet.scheduler.predict import Prediction
from gpufleet.server.jobstate.states import ACTIVE, JobState
from gpufleet.server.jobstate.transitions import JobRef
from gpufleet.server.loops import dependencies, eligibility
from gpufleet.server.loops.history import EndedFeed, Predictions, traits
from gpufleet.server.loops.reservations import Booked, load_booked
from gpufleet.server.services import layoutwait, racks
from gpufleet.server.services.inventory import LiveFleet
from gpufleet.server.store import ledger
from gpufleet.server.store.models import Allocation, Job, LicenseRow, QosRow, Team, User

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
    cuda: str | None
    checkpoint_s: float | None
    preempt_at: float | None
    preempt_by: int | None
    predicted_s: float | None
    predicted_conf: float | None
    prediction_basis: str | None

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

    def request(
        self,
        jid: int,
        teams: dict[int, str],
        users: dict[int, str],
        qos: QosTerms,
        predicted: Prediction | None,
    ) -> JobRequest:
        job, jref, req = self.rows[jid]
        if req is None:
            req = _request(job, teams, users, qos, predicted)
            self.rows[jid] = (job, jref, req)
        return req

    def check_names(self, teams: dict[int, str], users: dict[int, str], qos: QosTerms) -> None:
        if (teams, users, qos) != self.names:
            self.rows = {jid: (job, jref, None) for jid, (job, jref, _) in self.rows.items()}
            self.names = (teams, users, qos)

    def clear(self) -> None:
        self.rows = {}


@dataclass(frozen=True, slots=True, kw_only=True)
class Loaded:
    """What a pass read: the core's snapshot and what the commit needs beside it."""

    snapshot: Snapshot
    refs: dict[str, JobRef]
    """Job id (the core's string) -> the CAS ref of the row the snapshot was read from."""
    booked: list[Booked] = field(default_factory=list)
    kill: dict[int, str] = field(default_factory=dict)
    """Waiting jobs this pass cancels, and why: a dependency that can never be
    satisfied (with ``kill_on_invalid_dep``), a deadline that can no longer be met."""


class SnapshotReader:
    """Reads each pass's ``Snapshot``; one per scheduling loop (its caches are this
    loop's own)."""

    def __init__(self) -> None:
        self._fleet = LiveFleet()
        self._pending = _PendingCache()
        self.history = EndedFeed()
        """The predictor and what it learnt (``history.py``)."""
        self.predictions = Predictions()
        """Each job's prediction, and the new ones the pass's commit writes."""

    @property
    def skipped_nodes(self) -> int:
        """Nodes the last read left out (their rows are invalid: ``inventory.py``)."""
        return len(self._fleet.skipped)

    def forget(self) -> None:
        """Read every pending job again next time (an attempt was rejected)."""
        self._pending.clear()

    def load(self, s: Session, now: float, *, live_since: float) -> Loaded:
        """The snapshot at ``now``; nodes are live if heard from since ``live_since``."""
        fleet = self._fleet.load(s, live_since=live_since)
        self.history.read(s, now)  # the jobs that ended since the last pass teach it first
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
        leaving: dict[int, list[_JobRow]] = {}  # a preemptor -> its victims in their grace
        active = [str(a) for a in ACTIVE]
        for row in s.execute(_JOB_COLUMNS.where(Job.state.in_(active))):
            job = _JobRow(*row)
            refs[str(job.id)] = job.ref()
            if job.preempt_at is not None and job.preempt_by is not None:
                leaving.setdefault(job.preempt_by, []).append(job)
            parts = placements.get(job.id, {})
            running.append(
                RunningJob(
                    job=_request(job, teams, users, qos, self._predict(job)),
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
            if req is None:
                req = self._pending.request(job.id, teams, users, qos, self._predict(job))
            pending.append(req)
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
        for jid, victims in leaving.items():  # ``jobstate/preemption.py``
            held_back.setdefault(jid, _awaiting(victims))
        if held_back or kill:
            pending = [
                replace(p, blocked=hb) if (hb := held_back.get(int(p.id))) else p
                for p in pending
                if int(p.id) not in kill
            ]
        self.predictions.keep(
            len(self._pending.rows) + len(running),
            lambda: self._pending.rows.keys() | {int(r.job.id) for r in running},
        )
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
            power=racks.power_model(s, now),  # rack power budgets and readings (scheduler/power.py)
        )
        return Loaded(snapshot=snap, refs=refs, booked=booked, kill=kill)

    def _predict(self, job: _JobRow) -> Prediction | None:
        """``job``'s run time, predicted once (``history.Predictions``); none for a
        service's replica (it runs until scaled down)."""
        if job.service_id is not None:
            return None
        known = self.predictions.rows
        if job.id in known:  # every pass, for each running job: no traits built
            return known[job.id]
        return self.predictions.of(
            self.history.predictor,
            job_id=job.id,
            job=traits(
                user_id=job.user_id,
                team_id=job.team_id,
                name=job.name,
                gpus=job.gpus,
                time_limit_s=job.time_limit_s,
            ),
            stored=(job.predicted_s, job.predicted_conf, job.prediction_basis),
        )


def _awaiting(victims: list[_JobRow]) -> Blocked:
    """A preemptor's wait while its victims use their grace (they hold its GPUs)."""
    until = max(v.preempt_at or 0.0 for v in victims)
    ids = ", ".join(str(v.id) for v in victims)
    why = f"job(s) {ids} preempted for it, in their grace"
    return Blocked(code="Resources", detail=why, not_before=until)


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


def _request(
    job: _JobRow,
    teams: dict[int, str],
    users: dict[int, str],
    qos: QosTerms,
    predicted: Prediction | None,
) -> JobRequest:
    """The core's view of ``job``; its QOS's priority is added to its own (within the
    API's -1000..1000) and a QOS that is not preemptable makes it a non-victim. Its
    predicted run time is at most its time limit (which may have gone down since)."""
    boost, preemptable = qos.get(job.qos, (0, True)) if job.qos is not None else (0, True)
    predicted_s = None if predicted is None else predicted.duration_s
    if predicted_s is not None and job.time_limit_s is not None and job.time_limit_s > 0:
        predicted_s = min(predicted_s, job.time_limit_s)
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
        # A job in a preemption's grace is leaving already (``jobstate/preemption.py``).
        preemptible=job.requeue and job.service_id is None and preemptable and job.preempt_at is None,
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
        cuda=parse_reported(job.cuda),
        checkpoint_s=job.checkpoint_s,
        predicted_s=predicted_s,
        predicted_confidence=0.0 if predicted is None else predicted.confidence,
    )
