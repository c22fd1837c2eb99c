"""Submitting jobs: validation against pools, memberships, fleets, caps and
reservations, then one group-committed insert with the "submitted" event.

The steps, each in its module: the options read and checked before the transaction
(``submitopts.py``); the batch in the group-commit queue and what it looks up once
(``submitbatch.py``); in the transaction, the checks against the accounts, claims and
records (``submitchecks.py``, with what a submission may claim) and against the pool's
fleet (``submitfit.py``); here, ``submit`` and the insert (``insert_jobs``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import bindparam, insert, update
from sqlalchemy.orm import Session

from gpufleet import constraint, slurmopts
from gpufleet.api.jobs import JobDetail, JobEventOut, JobSubmit
from gpufleet.arrayspec import parse_array
from gpufleet.scheduler import deps
from gpufleet.server.jobstate.states import JobState
from gpufleet.server.jobstate.transitions import event_row
from gpufleet.server.problems import Failure, invalid
from gpufleet.server.services import arraysubmit
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.caps import PendingCounts
from gpufleet.server.services.inventory import FleetCache
from gpufleet.server.services.submitbatch import NewJob, PoolDefaults, look_up
from gpufleet.server.services.submitchecks import (
    dependency_problem,
    license_problem,
    priority_problem,
    reservation_problem,
    team_for,
    with_qos,
)
from gpufleet.server.services.submitfit import choose_pool, feature_problem, fit_gpu_memory, shape_problem
from gpufleet.server.services.submitopts import (
    batch_options,
    counted_gpus,
    one_node_of_slices,
    requeue_backoff,
    time_limit,
)
from gpufleet.server.store import effects
from gpufleet.server.store.models import Job
from gpufleet.server.store.writer import Writer, call

# Submission's statements, built once (Core, not ORM: see ``insert_jobs``).
_T = Job.metadata.tables
_INSERT_JOBS = insert(_T["jobs"]).returning(_T["jobs"].c.id, sort_by_parameter_order=True)
_INSERT_EVENTS = insert(_T["job_events"])
_SET_ARRAY = (
    update(_T["jobs"]).where(_T["jobs"].c.id == bindparam("jid")).values(array_job_id=bindparam("array"))
)


async def submit(
    *,
    writer: Writer,
    actor: Principal,
    spec: JobSubmit,
    now: float,
    fleets: FleetCache,
    budget_warning: Callable[[str], str | None] = lambda team: None,
    pending: PendingCounts | None = None,
) -> JobDetail | Failure:
    """Validate and insert in one transaction (shared with concurrent submits through
    the group-commit ``writer``); returns once committed, without holding a thread
    while it waits. The reply warns when the job's team is over its soft budget.
    ``pending``: the per-user cap on queued jobs (403 past it)."""
    claimed = priority_problem(actor, spec)
    if claimed is not None:
        return claimed
    spec = counted_gpus(spec)
    if spec.constraint is not None:
        try:
            spec = spec.model_copy(update={"constraint": str(constraint.parse(spec.constraint))})
        except ValueError as exc:
            return invalid(f"constraint: {exc}")
    shaped = one_node_of_slices(spec)
    if isinstance(shaped, Failure):
        return shaped
    spec = shaped
    limit = time_limit(spec.time_limit)
    if isinstance(limit, Failure):
        return limit
    backoff = requeue_backoff(spec.requeue_backoff)
    if isinstance(backoff, Failure):
        return backoff
    try:
        array = None if spec.array is None else parse_array(spec.array)
    except ValueError as exc:
        return invalid(f"array: {exc}")
    try:
        dependency = None if spec.dependency is None else deps.parse(spec.dependency)
    except deps.DependencyError as exc:
        return invalid(f"dependency: {exc}")
    options = batch_options(spec, now=now, time_limit_s=limit)
    if isinstance(options, Failure):
        return options
    new = NewJob(
        actor=actor,
        options=options,
        spec=spec,
        time_limit_s=limit,
        now=now,
        fleets=fleets,
        backoff_s=backoff,
        pending=pending,
        array=array,
        dependency=dependency,
    )
    out = await call(writer, insert_jobs, new)  # the commit woke the scheduler (``insert_jobs``)
    if isinstance(out, Failure):
        return out
    warning = budget_warning(out.team)
    return out if warning is None else out.model_copy(update={"warnings": [warning]})


def insert_jobs(s: Session, batch: Sequence[NewJob]) -> list[JobDetail | Failure]:
    """The group-commit ``BulkOp`` of submissions: check every job against the pools,
    memberships and fleets of this transaction (one query each per batch, not per job),
    then insert the valid ones and their "submitted" events with two multi-row INSERTs
    (prepared Core statements: this is the API's hottest path); of an array only the
    first task is a row there, the others are copies of it made in SQL
    (``arraysubmit.insert_rest``: 10,000 tasks in ~0.08 s instead of 0.66 s). A refused job is a
    Failure and writes nothing; a batch that inserted some wakes the scheduler once it
    has committed (``effects.py``)."""
    ctx = look_up(s, batch)
    conn = s.connection()
    out: list[Failure | None] = []  # None: accepted
    rows: list[dict[str, Any]] = []
    accepted: list[tuple[int, NewJob, str, dict[str, Any]]] = []
    for new in batch:
        team = team_for(ctx, new.actor, new.spec.team)
        if isinstance(team, Failure):
            out.append(team)
            continue
        placed = choose_pool(ctx, new)
        if isinstance(placed, Failure):
            out.append(placed)
            continue
        qosed = with_qos(ctx, placed)
        if isinstance(qosed, Failure):
            out.append(qosed)
            continue
        if qosed.spec.licenses and (short := license_problem(ctx, qosed.spec.licenses)) is not None:
            out.append(short)
            continue
        new = qosed
        if new.spec.gpu_memory is not None or new.spec.gpu_fraction is not None:
            fitted = fit_gpu_memory(ctx, new)
            if isinstance(fitted, Failure):
                out.append(fitted)
                continue
            new = fitted
        problem = (
            shape_problem(ctx, new.spec, new.fleets)
            or feature_problem(ctx, new)
            or reservation_problem(ctx, new)
            or dependency_problem(ctx, new)
        )
        if problem is not None:
            out.append(problem)
            continue
        row = _first_row(new, team[0], ctx.pools[new.spec.pool])
        if new.pending is not None:  # last: it counts the jobs as accepted
            who, count = new.actor, 1 if new.array is None else len(new.array.indices)
            short = new.pending.admit(s, user_id=who.user_id, name=who.name, role=who.role, jobs=count)
            if short is not None:
                out.append(short)
                continue
        accepted.append((len(out), new, team[1], row))
        out.append(None)
        rows.append(row)  # an array's first task: the others are copies of its row
    if not rows:
        return [f for f in out if f is not None]
    ids = iter(conn.execute(_INSERT_JOBS, rows).scalars().all())
    events: list[dict[str, Any]] = []
    details: dict[int, JobDetail] = {}
    for at, new, team_name, row in accepted:
        actor, job_id, held = new.actor.name, next(ids), bool(new.spec.hold)
        if new.array is None:
            why = "submitted held" if held else "submitted"
        else:
            why = arraysubmit.reason(row["array_task_id"], held=held)
        dst = JobState.HELD if held else JobState.PENDING
        ev = event_row(job_id=job_id, at=new.now, actor=actor, src=None, dst=dst, reason=why)
        events.append(ev)
        if new.array is not None:  # the array's id is its first task's (Slurm's ArrayJobId)
            conn.execute(_SET_ARRAY, [{"jid": job_id, "array": job_id}])
            row["array_job_id"] = job_id
            rest = new.array.indices[1:]
            arraysubmit.insert_rest(conn, first=job_id, indices=rest, at=new.now, actor=actor, held=held)
        details[at] = _submitted(job_id, row, user=actor, team=team_name, event=ev)
    conn.execute(_INSERT_EVENTS, events)
    effects.wake_scheduler(s)
    return [details[i] if f is None else f for i, f in enumerate(out)]


def _first_row(new: NewJob, team_id: int, pool: PoolDefaults) -> dict[str, Any]:
    """The job's row, or its first task's for an array (``array_job_id`` is set after the
    insert; the other tasks are copies of it: ``arraysubmit.insert_rest``)."""
    row = _row(new, team_id)
    row["cpus_per_node"], row["mem_per_node_mb"] = _resources(new, pool)
    if new.array is None:
        return row
    ix = new.array.indices
    info = {"count": len(ix), "min": ix[0], "max": ix[-1]}
    return row | {"array_task_id": ix[0], "array_limit": new.array.limit, "array_info": info}


def _row(new: NewJob, team_id: int) -> dict[str, Any]:
    spec = new.spec
    return {
        "name": spec.name or spec.command[0].rsplit("/", 1)[-1][:128],
        "user_id": new.actor.user_id,
        "team_id": team_id,
        "pool": spec.pool,
        "gpus": spec.gpus,
        "gpus_per_node": spec.gpus_per_node,
        "nodes": spec.nodes,
        "gpu_type": spec.gpu_type,
        "priority": spec.priority,
        "time_limit_s": new.time_limit_s,
        "command": list(spec.command),
        "env": dict(spec.env),
        "image": spec.image,
        "requeue": spec.requeue,
        "max_attempts": spec.max_attempts,
        "attempts": 0,
        "requeue_backoff_s": new.backoff_s,
        "output": spec.output,
        "error": spec.error,
        "reservation_id": spec.reservation,
        "state": str(JobState.HELD if spec.hold else JobState.PENDING),
        # Slurm's reason for a job submitted held (sbatch -H), as a later hold writes it
        "wait_reason": f"JobHeldUser: held by {new.actor.name}" if spec.hold else None,
        "version": 0,
        "submit_time": new.now,
        "pending_since": new.now,
        "attained_service_s": 0.0,
        "executed_s": 0.0,
        "array_job_id": None,
        "array_task_id": None,
        "array_limit": 0,
        "array_info": None,
        "dependency": None if new.dependency is None else str(new.dependency),
        "kill_on_invalid_dep": spec.kill_on_invalid_dep,
        "submit_dir": spec.submit_dir,
        "workdir": spec.workdir,
        "input": spec.input,
        "signal": new.options.signal,
        "checkpoint_s": new.options.checkpoint_s,
        "cpus_per_task": new.options.cpus_per_task,
        "ntasks_per_node": new.options.tasks_per_node,
        "cpus_per_node": 0,
        "mem_per_node_mb": 0,
        "begin_at": new.options.begin_at,
        "deadline": new.options.deadline,
        "max_price": spec.max_price,
        "exclude": sorted(set(spec.exclude)) if spec.exclude else None,
        "constraint": spec.constraint,
        "qos": spec.qos,
        "licenses": dict(spec.licenses) if spec.licenses else None,
        "cuda": spec.cuda,  # canonical (api.jobs); where it may run: scheduler/cuda.py
    }


def _resources(new: NewJob, pool: PoolDefaults) -> tuple[int, int]:
    """(CPUs, MiB) the job holds on each of its nodes, the pool's defaults applied."""
    spec, opts = new.spec, new.options
    per_node_gpus = spec.gpus_per_node or (spec.gpus // spec.nodes if spec.nodes else spec.gpus)
    cpus = opts.cpus_per_node
    if not cpus:
        cpus = pool.cpus_per_gpu * per_node_gpus if spec.gpus else 1
    if opts.mem is None:
        mem = pool.mem_per_cpu_mb * cpus
    else:
        kind, mb = opts.mem
        mem = mb if kind == "node" else mb * (cpus if kind == "cpu" else max(1, per_node_gpus))
    return cpus, min(mem, slurmopts.MAX_MEM_MB)


def _submitted(job_id: int, row: dict[str, Any], *, user: str, team: str, event: dict[str, Any]) -> JobDetail:
    """The reply to a submit, from the values just inserted (validated on the way in:
    ``model_construct`` skips validating them a second time)."""
    return JobDetail.model_construct(
        id=job_id,
        name=row["name"],
        user=user,
        team=team,
        pool=row["pool"],
        state=row["state"],
        gpus=row["gpus"],
        gpus_per_node=row["gpus_per_node"],
        nodes=row["nodes"],
        gpu_type=row["gpu_type"],
        priority=row["priority"],
        time_limit_s=row["time_limit_s"],
        command=row["command"],
        image=row["image"],
        requeue=row["requeue"],
        max_attempts=row["max_attempts"],
        attempts=0,
        submit_time=row["submit_time"],
        scheduled_at=None,
        started_at=None,
        ended_at=None,
        exit_code=None,
        attained_service_s=0.0,
        queue_position=None,
        estimated_start=None,
        wait_reason=None,
        allocation=[],
        reservation=row["reservation_id"],
        cost=0.0,
        energy_kwh=0.0,
        # Every field given: a default_factory left to ``model_construct`` makes pydantic
        # inspect the factory's signature per call (a third of the writer's CPU per job).
        warnings=[],
        env=row["env"],
        output=row["output"],
        error=row["error"],
        events=[JobEventOut.model_construct(**{k: event[k] for k in JobEventOut.model_fields})],
        array_job_id=row["array_job_id"],
        array_task_id=row["array_task_id"],
        dependency=row["dependency"],
        cpus_per_node=row["cpus_per_node"],
        mem_per_node_mb=row["mem_per_node_mb"],
        begin_at=row["begin_at"],
        deadline=row["deadline"],
        max_price=row["max_price"],
        qos=row["qos"],
        licenses=row["licenses"],
        cuda=row["cuda"],
        input=row["input"],
        submit_dir=row["submit_dir"],
        workdir=row["workdir"],
        signal=row["signal"],
        checkpoint_s=row["checkpoint_s"],
        cpus_per_task=row["cpus_per_task"],
        ntasks_per_node=row["ntasks_per_node"],
    )
