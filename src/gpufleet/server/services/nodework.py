"""The jobs of one node as its agent's sync sees them (``services/sync.py`` is the
endpoint; its docstring has the rules): what the node should run (``desired``), which
job attempts it may speak for (``scope_of``: the rest of an ended attempt's log too),
what its observations change (``observe``); ``services/logs.py`` stores its log bytes. A
node whose inventory cannot be taken is cordoned (``quarantine``). Everything here runs
inside the sync's transaction.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpufleet.api.nodes import (
    ArrayTask,
    DesiredJob,
    LogChunkIn,
    NodeSync,
    ObservedJob,
    PeerNode,
    ServiceProbe,
)
from gpufleet.server.jobstate.preemption import exited_in_grace
from gpufleet.server.jobstate.requeue import requeue
from gpufleet.server.jobstate.states import ACTIVE, JobState
from gpufleet.server.jobstate.transitions import attempt_of, move, ref, release_attempt
from gpufleet.server.services.logs import open_tails
from gpufleet.server.services.modelwishes import wishes
from gpufleet.server.services.nodeops import add_event
from gpufleet.server.services.steps import desired_steps
from gpufleet.server.store import ledger
from gpufleet.server.store.models import Allocation, Job, NodeRow, User

log = logging.getLogger("gpufleet.server")
ACTOR = "sync"
"""The actor of what the server decides on a node's report (its cordon)."""
PORT_BASE = 20_000
PORT_SPAN = 20_000


def master_port(job_id: int) -> int:
    return PORT_BASE + job_id % PORT_SPAN


# -- what the node should run ------------------------------------------------------------------


def desired(s: Session, node: str) -> list[DesiredJob]:
    q = (
        select(Job, User.name)
        .join(Allocation, Allocation.job_id == Job.id)
        .join(User, User.id == Job.user_id)
        .where(Allocation.node == node, Job.state.in_([str(a) for a in ACTIVE]))
        .order_by(Job.id)
    )
    jobs: dict[int, tuple[Job, str]] = {}
    for job, user in s.execute(q):
        jobs.setdefault(job.id, (job, user))
    if not jobs:
        return []
    placement: dict[int, dict[str, list[int]]] = {jid: {} for jid in jobs}
    aq = (
        select(Allocation.job_id, Allocation.node, Allocation.gpu_index)
        .where(Allocation.job_id.in_(jobs))
        .order_by(Allocation.id)
    )
    for jid, n, idx in s.execute(aq):
        gpus = placement[jid].setdefault(n, [])
        if idx is not None:
            gpus.append(idx)
    names = {n for p in placement.values() for n in p}
    cols = select(NodeRow.name, NodeRow.address, NodeRow.drain_deadline)
    addresses: dict[str, str | None] = {}
    drains: dict[str, float] = {}
    for name, address, drain_deadline in s.execute(cols.where(NodeRow.name.in_(names))):
        addresses[name] = address
        if drain_deadline is not None:
            drains[name] = drain_deadline
    out = [
        _desired_job(job, user, node, placement[jid], addresses, drains) for jid, (job, user) in jobs.items()
    ]
    out = _with_models(s, out, jobs)  # the services' wished models (issue 30)
    steps = desired_steps(s, node, {d.job_id: d.attempt for d in out})  # srun's tasks here (issue 31)
    return [d.model_copy(update={"steps": steps[d.job_id]}) if d.job_id in steps else d for d in out]


def _desired_job(
    job: Job,
    user: str,
    node: str,
    placement: dict[str, list[int]],
    addresses: dict[str, str | None],
    drains: dict[str, float],
) -> DesiredJob:
    """The placement's first node is the master; every node gets its rank in it."""
    peers = [PeerNode(node=n, address=addresses.get(n) or n, gpus=sorted(g)) for n, g in placement.items()]
    return DesiredJob(
        job_id=job.id,
        attempt=attempt_of(job.scheduled_at),
        name=job.name,
        command=job.command,
        env=job.env,
        image=job.image,
        gpus=sorted(placement.get(node, [])),
        time_limit_s=job.time_limit_s,
        deadline=_deadline(job, [drains[n] for n in placement if n in drains]),
        user=user,
        output=job.output,
        error=job.error,
        nodes=peers,
        node_rank=[p.node for p in peers].index(node),
        master_addr=peers[0].address,
        master_port=master_port(job.id),
        world_size=max(1, sum(len(p.gpus) for p in peers)),
        service=_probe(job),
        pool=job.pool,
        array=_array(job),
        submit_dir=job.submit_dir,
        workdir=job.workdir,
        input=job.input,
        signal=job.signal,
        cpus_per_task=job.cpus_per_task,
        ntasks_per_node=job.ntasks_per_node,
        cpus_per_node=job.cpus_per_node,
        mem_per_node_mb=job.mem_per_node_mb,
    )


def _deadline(job: Job, drains: list[float]) -> float | None:
    """When ``--signal`` counts down to: the end of its time limit, or of a preemption's
    grace (``jobstate/preemption.py``: the agent then signals it at once), or the drain
    deadline of one of its nodes (a drain or a driver upgrade requeues it then: it is told
    to checkpoint first, as Slurm signals jobs before a maintenance), whichever is sooner."""
    ends = [] if job.time_limit_s is None or job.started_at is None else [job.started_at + job.time_limit_s]
    if job.preempt_at is not None:
        ends.append(job.preempt_at)
    ends.extend(drains)
    return min(ends) if ends else None


def _with_models(s: Session, out: list[DesiredJob], jobs: dict[int, tuple[Job, str]]) -> list[DesiredJob]:
    """Each replica's ``ServiceProbe.models``: its service's wished models now
    (``modelwishes``; unlike the rest of the probe they change while it runs)."""
    ids = {jid: job.service_id for jid, (job, _) in jobs.items() if job.service_id is not None}
    wished = wishes(s, ids.values())
    return [
        d.model_copy(update={"service": d.service.model_copy(update={"models": wished[ids[d.job_id]]})})
        if d.service is not None and ids.get(d.job_id) in wished
        else d
        for d in out
    ]


def _array(job: Job) -> ArrayTask | None:
    info = job.array_info
    if job.array_job_id is None or job.array_task_id is None or not info:
        return None
    return ArrayTask(
        array_job_id=job.array_job_id,
        task_id=job.array_task_id,
        count=int(info.get("count", 1)),
        min=int(info.get("min", job.array_task_id)),
        max=int(info.get("max", job.array_task_id)),
    )


def _probe(job: Job) -> ServiceProbe | None:
    """A replica's probe, from what the replica controller put in its environment
    (``replicaset.replica_env``: the spec of the replica's own generation)."""
    if job.kind != "service":
        return None
    try:
        port = int(job.env.get("GPUFLEET_SERVICE_PORT", 8000))
    except (TypeError, ValueError):
        port = 8000
    return ServiceProbe(health_path=str(job.env.get("GPUFLEET_HEALTH_PATH", "/")), port=port)


# -- what the node may speak for ------------------------------------------------------------


def _why_not(job: Job | None, attempt: int | None, node: str, held: set[int]) -> str | None:
    """None if ``node`` may speak for this attempt of ``job``, else why not (a
    ``hot.REJECT_REASONS`` label)."""
    if attempt is None:
        return "no_attempt"
    if job is None:
        return "unknown_job"
    if job.id in held:
        return None if attempt == attempt_of(job.scheduled_at) else "stale_attempt"
    if node in job.stopping_nodes:
        stopped = job.stopping_attempt
        return None if stopped is None or attempt == stopped else "stale_attempt"
    return "not_assigned"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Scope:
    """A sync's items this node may speak for, judged on the state before the sync."""

    jobs: dict[int, Job]
    """The jobs the sync names that exist."""
    states: list[ObservedJob]
    logs: list[LogChunkIn]
    rejected: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(kind, reason) -> items dropped."""


def scope_of(s: Session, node: str, body: NodeSync) -> _Scope:
    ids = {o.job_id for o in body.jobs} | {c.job_id for c in body.logs}
    if not ids:
        return _Scope(jobs={}, states=[], logs=[])
    here = select(Allocation.id).where(Allocation.job_id == Job.id, Allocation.node == node).exists()
    jobs: dict[int, Job] = {}
    held: set[int] = set()
    for job, is_here in s.execute(select(Job, here).where(Job.id.in_(ids))):
        jobs[job.id] = job
        if is_here:
            held.add(job.id)
    out = _Scope(jobs=jobs, states=[], logs=[])
    for o in body.jobs:
        why = _why_not(jobs.get(o.job_id), o.attempt, node, held)
        if why is None:
            out.states.append(o)
        else:
            out.rejected[("state", why)] += 1
    refused: list[tuple[LogChunkIn, str]] = []
    for c in body.logs:
        why = _why_not(jobs.get(c.job_id), c.attempt, node, held)
        if why is None:
            out.logs.append(c)
        else:
            refused.append((c, why))
    tails = open_tails(s, node, jobs, {(c.job_id, c.attempt) for c, _ in refused}) if refused else set()
    for c, why in refused:  # the rest of an ended attempt's log, which this node ran
        if (c.job_id, c.attempt) in tails:
            out.logs.append(c)
        else:
            out.rejected[("log", why)] += 1
    return out


# -- observations --------------------------------------------------------------------------------


def _transition(o: ObservedJob, job: Job) -> JobState | None:
    """The move an observation the node may make asks for, None if it changes nothing
    (an attempt being stopped has left SCHEDULED/RUNNING already)."""
    st = JobState(job.state)
    if o.state == "running" and st == JobState.SCHEDULED:
        return JobState.RUNNING
    if o.state == "lost" and st in ACTIVE:
        return JobState.REQUEUED
    if o.state == "exited" and st in ACTIVE:
        return JobState.COMPLETED if (o.exit_code or 0) == 0 and o.exit_code is not None else JobState.FAILED
    return None


def _stops_confirmed(s: Session, node: str, body: NodeSync) -> list[Job]:
    """Jobs told to stop here that the node reports running no attempt of."""
    running = {o.job_id for o in body.jobs if o.state == "running"}
    q = select(Job).where(Job.stopping_on.is_not(None), Job.stopping_on.contains(node))
    return [job for job in s.scalars(q) if node in job.stopping_nodes and job.id not in running]


def _latest(scope: _Scope) -> list[ObservedJob]:
    """One observation per job (the last: a sync is one moment of the node)."""
    return list({o.job_id: o for o in scope.states}.values())


def observe(
    s: Session,
    node: str,
    body: NodeSync,
    scope: _Scope,
    actor: str,
    now: float,
    readings: ledger.Readings,
) -> bool:
    """Apply the observations the node may make; True if a job changed. Raises
    ``Conflict`` on a lost CAS."""
    changed = False
    for o in _latest(scope):
        job = scope.jobs[o.job_id]
        to = _transition(o, job)
        if to is None:
            continue
        if to == JobState.REQUEUED:
            requeue(s, job, now=now, actor=actor, reason=f"attempt vanished on {node}", lost=(node,))
            changed = True
            continue
        if to == JobState.RUNNING:
            values = {"started_at": now}
            reason = f"running on {node}"
        elif exited_in_grace(
            s, job, node=node, exit_code=o.exit_code, actor=actor, now=now, readings=readings
        ):
            changed = True  # asked to leave: preempted, not ended (``jobstate/preemption.py``)
            continue
        else:
            code = o.exit_code if o.exit_code is not None else -1
            values = release_attempt(
                s, job, now=now, confirmed=False, confirmed_on=node, readings=readings
            ) | {"exit_code": code}
            reason = f"exited with code {code} on {node}"
            if job.state == JobState.SCHEDULED:  # it ran and ended between two syncs
                move(s, ref(job), to, actor=actor, reason=reason, now=now, values=values | _ran(job, now))
                changed = True
                continue
        move(s, ref(job), to, actor=actor, reason=reason, now=now, values=values)
        changed = True
    for job in _stops_confirmed(s, node, body):
        job.stopping_nodes = [n for n in job.stopping_nodes if n != node]
        changed = True
    for o in _latest(scope):
        seen = _readiness(o, scope.jobs[o.job_id], now)
        if seen:
            s.execute(update(Job).where(Job.id == o.job_id).values(**seen))
            changed = True
    return changed


def _ran(job: Job, now: float) -> dict[str, object]:
    """What a job that ended before any sync saw it running ran: since it was placed (its
    agent starts it within a sync of that), so it has a start, a run time and service
    like any job that ran (an exit is reported at once, log shipping or not)."""
    start = job.scheduled_at if job.scheduled_at is not None else now
    ran = max(0.0, now - start)
    return {
        "started_at": start,
        "executed_s": job.executed_s + ran,
        "attained_service_s": job.attained_service_s + job.gpus * ran,
    }


def _readiness(o: ObservedJob, job: Job, now: float) -> dict[str, object]:
    """A running replica's readiness and endpoint as its agent reports them, when they
    changed (plain columns: no version bump, the scheduling pass never reads them)."""
    if job.kind != "service" or o.state != "running" or o.ready is None:
        return {}
    if JobState(job.state) not in ACTIVE:
        return {}
    models = None if o.models is None else [m.model_dump() for m in o.models]
    if (job.ready, job.endpoint) == (o.ready, o.endpoint) and models in (None, job.model_states):
        return {}
    values: dict[str, object] = {"ready": o.ready, "endpoint": o.endpoint}
    if models is not None:  # a replica's wished models as its agent saw them (issue 30)
        values["model_states"] = models
    if o.ready and not job.ready:
        values["ready_at"] = now
    return values


def would_change(s: Session, node: str, body: NodeSync, scope: _Scope) -> bool:
    if any(_transition(o, scope.jobs[o.job_id]) is not None for o in _latest(scope)):
        return True
    if any(_readiness(o, scope.jobs[o.job_id], 0.0) for o in _latest(scope)):
        return True
    return bool(_stops_confirmed(s, node, body))


# -- an inventory the server cannot take ------------------------------------------------------


def quarantine(s: Session, node: NodeRow, why: str, now: float) -> bool:
    """Cordon ``node`` because its inventory was refused (once per reason: a node that
    keeps sending the same one writes one event). True if it changed something."""
    reason = f"inventory refused: {why}"[:256]
    if node.cordoned and node.cordon_reason == reason:
        return False
    node.cordoned, node.cordon_reason = True, reason
    add_event(
        s,
        at=now,
        node=node.name,
        kind="cordoned",
        severity="critical",
        actor=ACTOR,
        reason=f"{reason}; its stored GPUs are kept, nothing new lands on it until an operator uncordons it",
    )
    log.warning("node %s cordoned: %s", node.name, reason)
    return True
