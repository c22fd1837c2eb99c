"""The scheduling loop: DB -> Snapshot -> ``gpufleet.scheduler.plan`` -> one commit.

It runs in one background *thread* with synchronous SQLAlchemy (the API's handlers are
sync too and run in FastAPI's thread pool): the work is blocking DB I/O plus a CPU-bound
plan, so an asyncio loop would only add hops. A pass runs when woken (submit, finish,
node change: ``wake()``) and at least every ``interval_s``.

Each pass, observe then act (Ray autoscaler's sync/step split):

1. *time limits*: RUNNING jobs past ``started_at + time_limit_s`` -> TIMEOUT at once
   (the server's clock rules; the agent is told to stop them through the sync reply and
   ``stopping_on`` waits for its confirmation). A SCHEDULED job's limit starts when it
   is confirmed RUNNING.
2. *snapshot*: Ready and uncordoned nodes are schedulable; running = SCHEDULED+RUNNING
   with their allocations; pending = PENDING GPU jobs not still stopping somewhere;
   quotas from teams.
3. *plan* with the configured policy (pure, no DB).
   Steps 2-3 run outside the write transaction, so a plan never holds the write lock.
4. *commit* in ONE transaction (with step 1): starts (PENDING -> SCHEDULED + allocations),
   preemptions (-> PREEMPTED -> PENDING, GPU-seconds kept, old nodes told to stop), and
   the pending statuses (position, estimated start, reason). Every job write is a
   compare-and-set on (state, version); if one fails the transaction rolls back and the
   pass restarts from a fresh snapshot, at most ``max_attempts`` times (Nomad's plan
   rejection). A failed pass is logged and counted; the loop goes on.

0-GPU jobs in a CPU-only pool are outside the core (it schedules GPUs): they start on
the Ready, uncordoned node of their pool that runs the fewest jobs, in queue order.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from gpufleet.scheduler import JobRequest, NodeGpus, Plan, Policy, Quota, RunningJob, Snapshot, plan
from gpufleet.server.clock import Clock
from gpufleet.server.db import Database
from gpufleet.server.models import Allocation, Job, NodeRow, Pool, Team, User
from gpufleet.server.services.inventory import LiveFleet
from gpufleet.server.services.reservations import Booked, load_booked, step_reservations
from gpufleet.server.states import ACTIVE, JobState
from gpufleet.server.transitions import JobRef, move, ref, stop_values

log = logging.getLogger("gpufleet.scheduling")
ACTOR = "scheduler"


class _Retry(Exception):
    pass


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
    cpu_pending: list[Job]
    booked: list[Booked] = field(default_factory=list)


@dataclass(slots=True)
class _StatusCache:
    """Last written PendingStatus per job, so a pass writes only what changed."""

    rows: dict[int, tuple[int | None, float | None, str | None]] = field(default_factory=dict)


class SchedulerLoop:
    def __init__(
        self,
        *,
        db: Database,
        policy: Policy,
        clock: Clock,
        node_timeout_s: float,
        interval_s: float = 1.0,
        max_attempts: int = 5,
        busy_factor: float = 4.0,
        on_pass: Callable[[Snapshot, Plan, float], None] | None = None,
        reservation_idle_release_s: float = 900.0,
    ) -> None:
        self.reservation_idle_release_s = reservation_idle_release_s
        self.on_pass = on_pass
        """Called after each committed pass with its snapshot, plan and duration in
        seconds (the metrics; ``server/metrics``). Its errors are logged, never raised."""
        self.busy_factor = busy_factor
        self.db = db
        self.policy = policy
        self.clock = clock
        self.node_timeout_s = node_timeout_s
        self.interval_s = interval_s
        self.max_attempts = max_attempts
        self.passes = 0
        self.failures = 0
        self._event = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._statuses = _StatusCache()
        self._fleet = LiveFleet()

    # -- the thread -----------------------------------------------------------------------
    def wake(self) -> None:
        self._event.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpufleet-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._event.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        """Passes back to back would starve the API under a stream of wake-ups, so once
        passes run back to back (woken again while running, twice in a row) the loop
        rests ``busy_factor * d`` after a pass of d seconds (at most the interval): it
        then takes at most 1/(1+busy_factor) of the process. An occasional wake-up is
        served at once."""
        streak = 0
        while not self._stop.is_set():
            self._event.wait(self.interval_s)
            self._event.clear()
            if self._stop.is_set():
                return
            t0 = time.monotonic()
            try:
                self.run_once()
            except Exception:  # never die: log, count, go on
                self.failures += 1
                log.exception("scheduling pass failed")
            streak = streak + 1 if self._event.is_set() else 0
            if streak >= 2:
                self._stop.wait(min(self.interval_s, self.busy_factor * (time.monotonic() - t0)))

    # -- one pass -------------------------------------------------------------------------
    def run_once(self) -> PassResult:
        t0 = time.perf_counter()
        for attempt in range(1, self.max_attempts + 1):
            now = self.clock.now()
            try:
                with self.db.read() as s:
                    loaded = self._load(s, now)
                result = plan(loaded.snapshot, self.policy, explain=True)
                with self.db.write() as s:
                    timed_out = self._time_limits(s, now)
                    started = self._commit(s, loaded, result, now)
                    started += self._start_cpu_jobs(s, loaded.cpu_pending, now)
            except (_Retry, IntegrityError, OperationalError) as exc:
                log.info("scheduling pass attempt %d rejected (%s); retrying", attempt, type(exc).__name__)
                self._statuses.rows.clear()
                continue
            self.passes += 1
            if self.on_pass is not None:
                try:
                    self.on_pass(loaded.snapshot, result, time.perf_counter() - t0)
                except Exception:
                    log.exception("scheduling pass observer failed")
            return PassResult(
                started=started,
                preempted=len(result.preemptions),
                timed_out=timed_out,
                waiting=len(result.pending),
                attempts=attempt,
            )
        self.failures += 1
        log.warning("scheduling pass gave up after %d attempts", self.max_attempts)
        return PassResult(attempts=self.max_attempts)

    def _time_limits(self, s: Session, now: float) -> int:
        q = select(Job).where(
            Job.state == str(JobState.RUNNING),
            Job.time_limit_s.is_not(None),
            Job.started_at.is_not(None),
            Job.started_at + Job.time_limit_s <= now,
        )
        n = 0
        for job in s.scalars(q):
            vals = stop_values(s, job, now=now, confirmed=False)
            reason = f"time limit {job.time_limit_s:g}s reached"
            if not move(s, ref(job), JobState.TIMEOUT, actor=ACTOR, reason=reason, now=now, values=vals):
                raise _Retry
            n += 1
        return n

    def _load(self, s: Session, now: float) -> _Loaded:
        fleet = self._fleet.load(s, live_since=now - self.node_timeout_s)
        teams = dict(s.execute(select(Team.id, Team.name)).tuples().all())
        users = dict(s.execute(select(User.id, User.name)).tuples().all())
        quotas = tuple(
            Quota(team=t.name, gpus=t.quota_gpus, limit=t.quota_limit)
            for t in s.scalars(select(Team).where(Team.quota_gpus.is_not(None)))
            if t.quota_gpus is not None
        )
        refs: dict[str, JobRef] = {}
        placements: dict[int, dict[str, list[int]]] = {}
        q = select(Allocation.job_id, Allocation.node, Allocation.gpu_index).where(
            Allocation.gpu_index.is_not(None)
        )
        for jid, node, idx in s.execute(q).tuples():
            placements.setdefault(jid, {}).setdefault(node, []).append(idx)  # type: ignore[arg-type]
        running: list[RunningJob] = []
        for job in s.scalars(select(Job).where(Job.state.in_([str(a) for a in ACTIVE]), Job.gpus > 0)):
            refs[str(job.id)] = ref(job)
            parts = placements.get(job.id, {})
            running.append(
                RunningJob(
                    job=_request(job, teams, users),
                    placement=tuple(
                        NodeGpus(node=n, gpus=tuple(sorted(g))) for n, g in sorted(parts.items())
                    ),
                    started_at=job.started_at or job.scheduled_at or now,
                )
            )
        pending: list[JobRequest] = []
        cpu_pending: list[Job] = []
        pq = (
            select(Job)
            .where(Job.state == str(JobState.PENDING), Job.stopping_on.is_(None))
            .where(Job.not_before.is_(None) | (Job.not_before <= now))  # a requeue's backoff
            .order_by(Job.id)
        )
        for job in s.scalars(pq):
            refs[str(job.id)] = ref(job)
            if job.gpus == 0:
                cpu_pending.append(job)
            else:
                pending.append(_request(job, teams, users))
        booked = load_booked(s, now)
        snap = Snapshot(
            now=now,
            fleet=fleet,
            running=tuple(running),
            pending=tuple(pending),
            quotas=quotas,
            reservations=tuple(b.core for b in booked),
        )
        return _Loaded(snapshot=snap, refs=refs, cpu_pending=cpu_pending, booked=booked)

    def _commit(self, s: Session, loaded: _Loaded, result: Plan, now: float) -> int:
        for pre in result.preemptions:
            jref = loaded.refs[pre.job_id]
            job = s.get(Job, jref.id)
            assert job is not None
            vals = stop_values(s, job, now=now, confirmed=False)
            vals |= {"ended_at": None, "pending_since": now, "scheduled_at": None, "started_at": None}
            if not move(
                s,
                jref,
                JobState.PENDING,
                via=JobState.PREEMPTED,
                actor=ACTOR,
                reason=pre.reason,
                now=now,
                values=vals,
            ):
                raise _Retry
        allocs: list[dict[str, Any]] = []
        for st in result.starts:
            jref = loaded.refs[st.job_id]
            where = " ".join(f"{p.node}{list(p.gpus)}" for p in st.placement)
            vals = {"scheduled_at": now, "queue_position": None, "estimated_start": None, "wait_reason": None}
            if not move(
                s,
                jref,
                JobState.SCHEDULED,
                actor=ACTOR,
                reason=f"placed on {where} ({result.policy})",
                now=now,
                values=vals,
            ):
                raise _Retry
            allocs += [
                {"job_id": jref.id, "node": p.node, "gpu_index": g} for p in st.placement for g in p.gpus
            ]
            self._statuses.rows.pop(jref.id, None)
        if allocs:
            s.execute(insert(Allocation), allocs)
        self._write_statuses(s, result, now)
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

    def _write_statuses(self, s: Session, result: Plan, now: float) -> None:
        rows: list[dict[str, Any]] = []
        for p in result.pending:
            jid = int(p.job_id)
            eta = None if p.estimated_start is None else round(p.estimated_start, 1)
            val = (p.position, eta, p.reason[:512])
            if self._statuses.rows.get(jid) != val:
                rows.append(
                    {"id": jid, "queue_position": val[0], "estimated_start": val[1], "wait_reason": val[2]}
                )
                self._statuses.rows[jid] = val
        if rows:
            # Positions are advisory and not part of the CAS: they do not bump the version.
            s.execute(update(Job), rows)

    def _start_cpu_jobs(self, s: Session, jobs: list[Job], now: float) -> int:
        if not jobs:
            return 0
        live_since = now - self.node_timeout_s
        cpu_pools = set(s.scalars(select(Pool.name).where(Pool.gpu.is_(False))))
        load = dict(s.execute(select(Allocation.node, func.count()).group_by(Allocation.node)).tuples().all())
        nodes = [
            n
            for n in s.scalars(select(NodeRow).where(NodeRow.pool.in_(cpu_pools)).order_by(NodeRow.name))
            if not n.cordoned and n.last_seen is not None and n.last_seen >= live_since
        ]
        n_started = 0
        for job in sorted(jobs, key=lambda j: (-j.priority, j.id)):
            choices = [n for n in nodes if n.pool == job.pool]
            if not choices:
                continue
            node = min(choices, key=lambda n: load.get(n.name, 0))
            vals = {"scheduled_at": now, "queue_position": None, "estimated_start": None, "wait_reason": None}
            if not move(
                s,
                ref(job),
                JobState.SCHEDULED,
                actor=ACTOR,
                reason=f"placed on {node.name} (cpu)",
                now=now,
                values=vals,
            ):
                raise _Retry
            s.execute(insert(Allocation), [{"job_id": job.id, "node": node.name, "gpu_index": None}])
            load[node.name] = load.get(node.name, 0) + 1
            n_started += 1
        return n_started


def _request(job: Job, teams: dict[int, str], users: dict[int, str]) -> JobRequest:
    return JobRequest(
        id=str(job.id),
        gpus=job.gpus,
        submit_time=job.submit_time,
        user=users.get(job.user_id, ""),
        team=teams.get(job.team_id, ""),
        priority=job.priority,
        gpus_per_node=job.gpus_per_node,
        nodes=job.nodes,
        gpu_type=job.gpu_type,
        pool=job.pool,
        time_limit_s=job.time_limit_s,
        attained_service_s=job.attained_service_s,
        executed_s=job.executed_s,
        pending_since=job.pending_since,
        preemptible=job.requeue,
        reservation=None if job.reservation_id is None else str(job.reservation_id),
    )
