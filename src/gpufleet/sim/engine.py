"""Discrete-event simulation in virtual time over the unchanged scheduling core.

Events: arrivals (from the trace), completions, GPU and node failures and repairs
(seeded Poisson injection), and scheduling passes. Passes run the way the server's loop
does: after something changed, at the next multiple of ``sched_interval_s`` (default
0.1 s: the server's pass is woken at once and its starts reach the nodes by push); preemptive
policies also get a pass every ``preempt_interval_s`` while jobs wait, because their
priorities change as service accrues.

Job model: a job needs ``duration_s`` of work on its GPUs. It checkpoints every
``checkpoint_s`` of work (the trace's, else ``SimConfig.checkpoint_interval_s``), counted
from each (re)start; a preempted or failed job keeps the work up to its last checkpoint,
loses the rest (counted, in GPU-seconds, per cause) and pays ``restart_overhead_s`` when
it runs again (interval 0: it loses nothing). Like the server, each attempt is stopped at
its time limit (TIMEOUT: ``started_at + time_limit_s``, restart overhead included).

What the core sees of a job is what the server would record: ``attained_service_s`` and
``executed_s`` are the GPU-seconds held and wall seconds run in earlier attempts, lost
work and restart overhead included (the server cannot tell them apart); only
``oracle_remaining_s`` (``srtf-oracle``'s) is the work really left. The job's declared
``checkpoint_s`` goes into its request; the simulator's default interval does not (a
server knows only what a job declared).

Events at one instant: arrivals first, then finishes, failures, repairs, reservation
windows and requeues, and the scheduling pass last, so a pass at t sees every submit and
exit of t, as a server sees a submit and an exit of the same second in one pass (before,
a finish at t could hand a GPU to an older job that an arrival at t then preempted).

Estimated starts (``SimConfig.estimate_starts``): a pass that sees a job for the first time
runs with ``explain=True`` (what a server's pass does every time; the decisions are the
same) and its estimated start is kept for the report (``sim/estimates.py``).

Predicted durations (``SimConfig.predict``): each job's run time is predicted by the first
pass that sees it, as the server's does (``scheduler/predict.py``), from the jobs that
ended before that pass, each observed at its final end with its whole run time (lost work
and restart overhead included: what a server records), and set on the request the core
sees.

GPU shares: when the fleet has shared GPUs (``shares.share_gpus``), a fractional trace
job (``gpu_milli`` < 1000) asks for a share of one (``shares.request_shape``) and the
core places it; ``shares.CapacityMeter`` keeps what is allocated, for the report's
allocated share, fragmentation and unallocated share at the first failure.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gpufleet.cudaver import parse_reported
from gpufleet.scheduler import (
    Fleet,
    JobRequest,
    Placement,
    PlanCache,
    Policy,
    Reservation,
    ReservationMove,
    RunningJob,
    Snapshot,
    plan,
)
from gpufleet.scheduler.core import shared_options
from gpufleet.scheduler.deps import Dependency, DependencyError, Phase, Ref, judge
from gpufleet.scheduler.deps import parse as parse_dependency
from gpufleet.scheduler.model import Blocked
from gpufleet.scheduler.predict import DurationPredictor, JobTraits
from gpufleet.sim.config import JobOutcome, SimConfig, SimResult
from gpufleet.sim.estimates import first_estimates, kept_work
from gpufleet.sim.outages import Outages
from gpufleet.sim.shares import CapacityMeter, physical_nodes, request_shape, shared_nodes
from gpufleet.sim.trace import TraceJob

FINISH, FAIL, REPAIR, WINDOW, REQUEUE, PASS = 0, 1, 2, 3, 4, 5  # heap order at one instant: PASS last


def traits(tj: TraceJob) -> JobTraits:
    """What a trace job's run time is predicted from (and recorded under when it ends)."""
    return JobTraits(user=tj.user, team=tj.team, name=tj.name, gpus=tj.gpus, time_limit_s=tj.time_limit_s)


@dataclass(slots=True)
class _Job:
    trace: TraceJob
    request: JobRequest
    remaining_s: float
    checkpoint_s: float = 0.0  # its interval in force (0: loses nothing)
    attained_gpu_s: float = 0.0
    executed_s: float = 0.0  # wall seconds run, as the server counts them
    queue_s: float = 0.0
    pending_since: float = 0.0
    started_at: float = 0.0
    overhead_s: float = 0.0  # paid at the start of the current attempt
    needs_restart: bool = False
    running: RunningJob | None = None
    version: int = 0
    first_start: float | None = None
    finish: float | None = None
    timed_out: bool = False
    preemptions: int = 0
    failures: int = 0


class Simulator:
    """Replays ``jobs`` (sorted by submit time) on ``fleet`` under ``policy``."""

    def __init__(
        self,
        jobs: Sequence[TraceJob],
        fleet: Fleet,
        policy: Policy,
        config: SimConfig,
        *,
        reservations: Sequence[Reservation] = (),
        record: bool = False,
    ) -> None:
        self.trace = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
        self.trace_ids = {j.job_id for j in self.trace}
        self.reservations = tuple(reservations)  # admitted already (see runner.admit_reservations)
        self.fleet = fleet
        self.healthy_fleet = fleet  # without outages: decides what can ever run
        self.shared = shared_nodes(fleet)
        self.meter = CapacityMeter(gpus=sum(len(n.gpus) for n in physical_nodes(fleet)), shared=self.shared)
        self.outages = Outages(fleet, self.meter, seed=config.seed)
        self.first_failure: tuple[float, float] | None = None
        self.policy = policy
        self.cfg = config
        # One cache for the whole run: the same Fleet, RunningJob and JobRequest objects
        # come back pass after pass, so their index, holdings and keys are reused.
        self.cache = PlanCache()
        self.held_teams = {h.team for h in config.holds}
        self.limits = {q.team: q.limit for q in config.quotas if q.limit is not None}
        self.events: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.now = 0.0
        self.pending: dict[str, _Job] = {}
        self.running: dict[str, _Job] = {}
        # What the snapshot shows of them, in the same order: kept alongside so that a
        # pass builds its tuples in C instead of walking the jobs (~180k passes per
        # 100k-job replay).
        self.pending_requests: dict[str, JobRequest] = {}
        self.running_jobs: dict[str, RunningJob] = {}
        self.done: list[_Job] = []
        self.rejected: list[tuple[str, str]] = []
        self.gpu_owner: dict[tuple[str, int], str] = {}
        self.limbo: dict[str, _Job] = {}  # on a failed node, waiting for the requeue delay
        self.next_pass: float | None = None
        self.preemptions = 0
        self.jobs_hit = 0  # job attempts stopped by a failure
        self.lost_gpu_s = {"preemption": 0.0, "failure": 0.0}  # work lost since checkpoints
        self.estimates: dict[str, float | None] = {}  # job -> estimated start at its first pass
        self.unseen: list[str] = []  # arrived, not yet in a pass (when estimating)
        self.busy = 0  # GPUs occupied now (a shared GPU while any unit of it is held)
        # Dependencies (``scheduler/deps.py``), judged each pass as the server does.
        self.deps: dict[str, Dependency] = {}  # pending jobs that have one
        self.arrived: set[str] = set()
        self.ended: dict[str, bool] = {}  # job -> ended COMPLETED (False: timed out, rejected)
        self.busy_gpu_s = 0.0
        self.frag_area = 0.0
        self.last_frag = 0.0
        self.last_t = self.trace[0].submit_s if self.trace else 0.0  # nothing held before
        self.passes = 0
        self.timeline: dict[str, list[float]] = {"t": [], "busy_gpus": [], "pending_jobs": []}
        self.next_sample = self.trace[0].submit_s if self.trace else 0.0
        self.record = record
        self.dirty = True  # pending or running changed since the last snapshot
        self.running_view: tuple[RunningJob, ...] = ()
        self.pending_view: tuple[JobRequest, ...] = ()
        self.log: list[tuple[float, str, str, Placement]] = []  # (t, start|stop, job, GPUs)
        self.predictor = DurationPredictor() if config.predict else None
        self.unpredicted: list[_Job] = []  # arrived, not yet in a pass (when predicting)

    # -- event plumbing ---------------------------------------------------------------
    def push(self, t: float, kind: int, data: object) -> None:
        heapq.heappush(self.events, (t, kind, self.seq, data))
        self.seq += 1

    def want_pass(self, t: float) -> None:
        step = self.cfg.sched_interval_s
        at = math.ceil(t / step) * step if step > 0 else t
        if self.next_pass is None or at < self.next_pass:
            self.next_pass = at
            self.push(at, PASS, at)

    def advance(self, t: float) -> None:
        if t >= self.next_sample:
            self.sample_until(t)
        dt = t - self.last_t
        if dt > 0:
            self.busy_gpu_s += self.busy * dt
            self.frag_area += self.last_frag * dt
            self.meter.advance(dt)
            self.last_t = t
        self.now = t

    def sample_until(self, t: float) -> None:
        """The timeline on a regular virtual clock (every ``sample_interval_s``): the
        state in force since the last event holds for every grid point before ``t``, so
        quiet stretches and the tail of the run are sampled too, not only pass times."""
        step = self.cfg.sample_interval_s
        busy, pending = float(self.busy), float(len(self.pending))
        while self.next_sample < t:
            self.timeline["t"].append(self.next_sample)
            self.timeline["busy_gpus"].append(busy)
            self.timeline["pending_jobs"].append(pending)
            self.next_sample += step

    # -- main loop --------------------------------------------------------------------
    def run(self, progress: Callable[[int], None] | None = None) -> SimResult:
        wall = time.perf_counter()
        self.schedule_failures()
        for r in self.reservations:
            self.push(r.start, WINDOW, r.id)
            self.push(r.end, WINDOW, r.id)
        arrivals = self.trace
        i = 0
        while i < len(arrivals) or self.events:
            next_event = self.events[0][0] if self.events else math.inf
            if i < len(arrivals) and arrivals[i].submit_s <= next_event:  # arrivals at t first
                tj = arrivals[i]
                i += 1
                self.advance(tj.submit_s)
                self.arrive(tj)
                if progress is not None and i % 1000 == 0:
                    progress(i)
                continue
            t, kind, _, data = heapq.heappop(self.events)
            self.advance(t)
            if kind == FINISH:
                self.finish(data)  # type: ignore[arg-type]
            elif kind == PASS:
                if data == self.next_pass:
                    self.next_pass = None
                    self.schedule_pass()
            elif kind == FAIL:
                self.fail(data)  # type: ignore[arg-type]
            elif kind == REPAIR:
                self.repair(data)  # type: ignore[arg-type]
            elif kind == WINDOW:
                self.want_pass(self.now)  # a reservation starts or ends
            elif kind == REQUEUE:
                self.enqueue(self.limbo.pop(str(data)))
                self.want_pass(self.now)
            if not self.waiting() and not self.running and not self.limbo and i >= len(arrivals):
                break  # only future failures remain
        if progress is not None:
            progress(len(arrivals))
        self.sample_until(self.now + self.cfg.sample_interval_s)  # the last point: the end state
        return self.result(time.perf_counter() - wall)

    def waiting(self) -> bool:
        """Whether a pending job could still start (jobs of held teams never do)."""
        if not self.held_teams:
            return bool(self.pending)
        return any(j.request.team not in self.held_teams for j in self.pending.values())

    def arrive(self, tj: TraceJob) -> None:
        self.arrived.add(tj.job_id)
        if tj.dependency:
            try:
                self.deps[tj.job_id] = parse_dependency(tj.dependency)
            except DependencyError as exc:
                self.reject(tj.job_id, str(exc))
                return
        gpus, per_node, nodes, gpu_type = request_shape(tj, shares=bool(self.shared))
        req = JobRequest(
            id=tj.job_id,
            user=tj.user,
            team=tj.team,
            gpus=gpus,
            gpus_per_node=per_node,
            nodes=nodes,
            gpu_type=gpu_type,
            priority=tj.priority,
            time_limit_s=tj.time_limit_s,
            submit_time=tj.submit_s,
            oracle_remaining_s=tj.duration_s,
            cuda=parse_reported(tj.cuda),  # as the server's snapshot reads jobs.cuda
            checkpoint_s=tj.checkpoint_s,  # declared only: the default is the simulator's
        )
        why: object
        if req.gpus == 0:  # placed by the core on the least busy node of its pool (cpu.py)
            pools = {n.pool for n in self.healthy_fleet.nodes}
            why = None if req.pool in pools else f"unknown pool {req.pool}"
        else:
            why = shared_options(self.cache.index(self.healthy_fleet), req)
        limit = self.limits.get(req.team)
        if limit is not None and req.gpu_weight > limit:  # it would wait for ever (QuotaLimit)
            why = f"needs {req.gpu_weight:g} GPUs, over team {req.team}'s hard limit of {limit}"
        if isinstance(why, str):
            self.reject(tj.job_id, why)
            return
        self.dirty = True
        every = tj.checkpoint_s if tj.checkpoint_s is not None else self.cfg.checkpoint_interval_s
        job = _Job(
            trace=tj, request=req, remaining_s=tj.duration_s, checkpoint_s=every, pending_since=tj.submit_s
        )
        self.enqueue(job)
        if self.cfg.estimate_starts:
            self.unseen.append(tj.job_id)
        if self.predictor is not None:
            self.unpredicted.append(job)
        self.want_pass(self.now)

    def reject(self, job_id: str, why: str) -> None:
        self.rejected.append((job_id, why))
        self.ended[job_id] = False
        self.deps.pop(job_id, None)

    def schedule_pass(self) -> None:
        if self.unpredicted:
            self.predict()
        if self.dirty:
            self.running_view = tuple(self.running_jobs.values())
            self.pending_view = tuple(self.pending_requests.values())
            self.dirty = False
        pending = self.pending_view if not self.deps else self.judge_dependencies()
        snap = Snapshot(
            now=self.now,
            fleet=self.fleet,
            running=self.running_view,
            pending=pending,
            quotas=self.cfg.quotas,
            reservations=self.reservations,
            holds=self.cfg.holds,
            power=self.cfg.power,
        )
        result = plan(snap, self.policy, explain=bool(self.unseen), cache=self.cache)
        if self.unseen:
            self.estimates.update(first_estimates(result, self.unseen))
            self.unseen.clear()
        for move in result.reservation_moves:
            self.move_reservation(move)
        self.passes += 1
        self.last_frag = result.fragmentation
        for pre in result.preemptions:
            self.stop(self.running[pre.job_id], preempted=True)
        for start in result.starts:
            self.start(self.dequeue(start.job_id), start.placement)
        if self.first_failure is None and self.pending:
            self.note_failure(pending)
        if self.policy.preemptive and self.waiting():
            self.want_pass(self.now + self.cfg.preempt_interval_s)

    def predict(self) -> None:
        """Predict the run time of the jobs that arrived since the last pass, from the jobs
        that ended before this pass: the server predicts a job when a pass first sees it."""
        assert self.predictor is not None
        for job in self.unpredicted:
            jid = job.trace.job_id
            guess = self.predictor.predict(traits(job.trace))
            if guess is None or self.pending.get(jid) is not job:
                continue
            job.request = replace(
                job.request, predicted_s=guess.duration_s, predicted_confidence=guess.confidence
            )
            self.pending_requests[jid] = job.request
            self.dirty = True
        self.unpredicted.clear()

    def note_failure(self, asked: tuple[JobRequest, ...]) -> None:
        """FGD's moment: a job that arrived and never ran (not held, not waiting for a
        dependency; a requeued one has run) is still waiting after a pass that saw it;
        the fleet's unallocated share then is the report's."""
        for req in asked:
            job = self.pending.get(req.id)
            new = job is not None and job.first_start is None
            if new and req.blocked is None and req.team not in self.held_teams:
                self.first_failure = (self.now, self.meter.unallocated_share())
                return

    def judge_dependencies(self) -> tuple[JobRequest, ...]:
        """The pending requests, those whose dependency does not hold marked blocked;
        one that can never hold is rejected (``DependencyNeverSatisfied``), as a server
        with ``kill_on_invalid_dep`` does: a replay must end. ``singleton`` is not
        modelled (traces have no job names)."""

        def lookup(ref: Ref) -> list[tuple[str, Phase]]:
            jid = str(ref.job) if ref.task is None else f"{ref.job}_{ref.task}"
            if jid in self.ended:
                return [(jid, Phase.OK if self.ended[jid] else Phase.NOT_OK)]
            if jid in self.running:
                return [(jid, Phase.STARTED)]
            if (
                jid in self.pending
                or jid in self.limbo
                or (jid in self.trace_ids and jid not in self.arrived)
            ):
                return [(jid, Phase.WAITING)]
            return []

        out: list[JobRequest] = []
        for req in self.pending_view:
            dep = self.deps.get(req.id)
            if dep is None:
                out.append(req)
                continue
            v = judge(dep, lookup)
            if v.satisfied:
                del self.deps[req.id]
                out.append(req)
            elif v.never:
                self.dequeue(req.id)
                self.reject(req.id, f"{v.code}: {v.detail}")
            else:
                out.append(replace(req, blocked=Blocked(code=v.code, detail=v.detail, after=v.waiting_on)))
        return tuple(out)

    def move_reservation(self, move: ReservationMove) -> None:
        def moved(r: Reservation) -> Reservation:
            nodes = dict(r.nodes)
            nodes[move.from_node] -= move.gpus
            nodes[move.to_node] = nodes.get(move.to_node, 0) + move.gpus
            return replace(r, nodes=tuple((n, c) for n, c in nodes.items() if c > 0))

        self.reservations = tuple(moved(r) if r.id == move.reservation else r for r in self.reservations)

    # -- job transitions --------------------------------------------------------------
    def enqueue(self, job: _Job) -> None:
        self.dirty = True  # a job back from limbo after a node loss must reach the next pass
        self.pending[job.trace.job_id] = job
        self.pending_requests[job.trace.job_id] = job.request

    def dequeue(self, job_id: str) -> _Job:
        self.dirty = True
        del self.pending_requests[job_id]
        return self.pending.pop(job_id)

    def start(self, job: _Job, placement: Placement) -> None:
        for part in placement:
            for g in part.gpus:
                key = (part.node, g)
                if key in self.gpu_owner or key in self.outages.down:
                    raise AssertionError(f"GPU {key} given to {job.trace.job_id} while taken or down")
                self.gpu_owner[key] = job.trace.job_id
        if self.record:
            self.log.append((self.now, "start", job.trace.job_id, placement))
        job.queue_s += self.now - job.pending_since
        job.started_at = self.now
        job.overhead_s = self.cfg.restart_overhead_s if job.needs_restart else 0.0
        if job.first_start is None:
            job.first_start = self.now
        job.running = RunningJob(job=job.request, placement=placement, started_at=self.now)
        run_for = job.overhead_s + job.remaining_s
        limit = job.trace.time_limit_s
        job.timed_out = limit is not None and run_for > limit
        if limit is not None and job.timed_out:
            run_for = limit  # the server's TIMEOUT: started_at + time_limit_s
        job.version += 1
        self.dirty = True
        self.running[job.trace.job_id] = job
        self.running_jobs[job.trace.job_id] = job.running
        self.busy += self.meter.hold(placement, 1)
        self.push(self.now + run_for, FINISH, (job.trace.job_id, job.version))

    def release(self, job: _Job) -> None:
        assert job.running is not None
        if self.record:
            self.log.append((self.now, "stop", job.trace.job_id, job.running.placement))
        for part in job.running.placement:
            for g in part.gpus:
                del self.gpu_owner[(part.node, g)]
        self.busy += self.meter.hold(job.running.placement, -1)
        self.dirty = True
        del self.running[job.trace.job_id]
        del self.running_jobs[job.trace.job_id]
        ran = self.now - job.started_at
        job.executed_s += ran
        job.attained_gpu_s += ran * job.request.gpu_weight
        job.running = None
        job.version += 1

    def finish(self, data: tuple[str, int]) -> None:
        job_id, version = data
        job = self.running.get(job_id)
        if job is None or job.version != version:
            return  # stale: the job was preempted or failed meanwhile
        self.release(job)
        job.remaining_s = 0.0
        job.finish = self.now
        self.done.append(job)
        self.ended[job_id] = not job.timed_out
        if self.predictor is not None:
            self.predictor.observe(traits(job.trace), job.executed_s)
        self.want_pass(self.now)

    def stop(self, job: _Job, *, preempted: bool, requeue_after_s: float = 0.0) -> None:
        """Take a running job off its GPUs and put it back in the queue, with the work up
        to its last checkpoint."""
        progress = min(job.remaining_s, max(0.0, self.now - job.started_at - job.overhead_s))
        kept = kept_work(progress, job.checkpoint_s)
        cause = "preemption" if preempted else "failure"
        self.lost_gpu_s[cause] += (progress - kept) * job.request.gpu_weight
        self.release(job)
        job.remaining_s = max(0.0, job.remaining_s - kept)
        job.needs_restart = True
        job.pending_since = self.now
        if preempted:
            job.preemptions += 1
            self.preemptions += 1
        else:
            job.failures += 1
            self.jobs_hit += 1
        job.request = replace(
            job.request,
            attained_service_s=job.attained_gpu_s,
            executed_s=job.executed_s,
            pending_since=self.now,
            oracle_remaining_s=job.remaining_s,
        )
        if requeue_after_s > 0:
            self.limbo[job.trace.job_id] = job
            self.push(self.now + requeue_after_s, REQUEUE, job.trace.job_id)
            return
        self.enqueue(job)
        self.want_pass(self.now)

    # -- failures ---------------------------------------------------------------------
    def schedule_failures(self) -> None:
        if self.cfg.gpu_failures_per_gpu_day > 0:
            self.next_failure("gpu")
        if self.cfg.node_failures_per_node_day > 0:
            self.next_failure("node")

    def next_failure(self, what: str) -> None:
        rate = self.cfg.gpu_failures_per_gpu_day if what == "gpu" else self.cfg.node_failures_per_node_day
        self.push(self.now + self.outages.next_in(what, rate), FAIL, what)

    def fail(self, what: str) -> None:
        if not self.waiting() and not self.running:
            return  # the trace is over: stop injecting
        hit = self.outages.hit(what)
        victims = {self.gpu_owner[k] for k in hit if k in self.gpu_owner}
        delay = self.cfg.requeue_after_s if what == "node" else 0.0
        for job_id in sorted(victims):
            self.stop(self.running[job_id], preempted=False, requeue_after_s=delay)
        self.fleet = self.outages.fleet()
        self.push(self.now + self.cfg.repair_s, REPAIR, hit)
        self.next_failure(what)
        self.want_pass(self.now)

    def repair(self, hit: list[tuple[str, int]]) -> None:
        self.outages.repair(hit)
        self.fleet = self.outages.fleet()
        self.want_pass(self.now)

    # -- results ----------------------------------------------------------------------
    def result(self, wall_s: float) -> SimResult:
        end = self.now
        makespan = max(end - (self.trace[0].submit_s if self.trace else 0.0), 1e-9)
        outcomes = [
            JobOutcome(
                job_id=j.trace.job_id,
                submit_s=j.trace.submit_s,
                first_start_s=j.first_start if j.first_start is not None else j.trace.submit_s,
                finish_s=j.finish if j.finish is not None else end,
                duration_s=j.trace.duration_s,
                gpus=j.trace.gpus,
                queue_s=j.queue_s,
                preemptions=j.preemptions,
                failures=j.failures,
                timed_out=j.timed_out,
            )
            for j in self.done
        ]
        return SimResult(
            policy=self.policy.name,
            outcomes=outcomes,
            rejected=self.rejected,
            preemptions=self.preemptions,
            failures_injected=sum(self.outages.injected.values()),
            gpu_failures=self.outages.injected["gpu"],
            node_failures=self.outages.injected["node"],
            jobs_hit_by_failures=self.jobs_hit,
            lost_gpu_s=dict(self.lost_gpu_s),
            first_estimates=self.estimates if self.cfg.estimate_starts else None,
            busy_gpu_s=self.busy_gpu_s,
            fleet_gpus=self.meter.gpus,
            fragmentation=self.frag_area / makespan,
            wall_s=wall_s,
            passes=self.passes,
            timeline=self.timeline,
            shared_gpus=len(self.shared),
            allocated_gpu_s=self.meter.allocated_gpu_s,
            free_gpu_s=self.meter.free_gpu_s,
            stranded_gpu_s=self.meter.stranded_gpu_s,
            first_failure=self.first_failure,
        )
