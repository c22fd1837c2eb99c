"""Slurm job steps (issue 31): ``srun`` inside an allocation, and the job's own credential.

The flow: ``srun`` (``gpufleet.slurm.srun``) posts the step with the job's credential
(``create_step``): the step and one row per task are written in one transaction, laid
out over the allocation's nodes (``layout``), and those nodes are rung (``dispatch``), so
their agents sync at once and find the step's tasks in their desired set
(``desired_steps``, part of ``nodework.desired``). Each agent starts its tasks as the
job's owner inside the job's attempt (its cgroup, GPUs and environment mark, so the
job's end ends them: ``agent/steps.py``) and reports them with their output
(``ingest_tasks``, in the sync's transaction). ``srun`` follows the step
(``show_step``: its state and the output stored after the piece it last saw) and exits
with its exit code.

A step ends when every task reported its exit: COMPLETED when all exited 0, else FAILED
with the highest code of the tasks that ended on their own (Slurm's srun: the highest).
With ``--kill-on-bad-exit`` the first non-zero exit makes the step ``stopping``: its
tasks leave the desired set and their agents stop them (reported ``killed``). A cancel
(``srun`` interrupted: ``cancel_step``) does the same and the step is CANCELLED. Steps
of a job that ended (or was requeued) are not written at its end: they read as
CANCELLED from then on (``_state``), and their tasks, which ran inside the job's
attempt, were ended with it by the agents.

The job credential (``GPUFLEET_TOKEN`` in a job's environment): ``gfj.JOB.ATTEMPT.MAC``,
MAC = HMAC of the job and attempt under the server's token key (``tokenkey.py``), so no
row holds it and every server of a cluster derives the same. It acts as the job's owner
with the role ``user`` (a job never acts as an operator or admin, whoever submitted it)
and is good only while that attempt is SCHEDULED/RUNNING or its nodes are still
stopping it (``stopping_attempt``): its end is its revocation, and a requeued job's new
attempt has a new credential. The agent receives it in the sync reply
(``DesiredJob.credential``, like the job's other secrets), never on a command line.
"""

from __future__ import annotations

import hmac
from collections import defaultdict
from collections.abc import Iterable, Sequence

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpufleet.api.base import INT32
from gpufleet.api.nodes import SyncReply
from gpufleet.api.steps import (
    MAX_STEPS,
    DesiredStep,
    StepAck,
    StepChunk,
    StepIn,
    StepList,
    StepOut,
    StepTaskIn,
    StepTaskOut,
)
from gpufleet.server.jobstate.states import ACTIVE, JobState
from gpufleet.server.jobstate.transitions import attempt_of
from gpufleet.server.problems import Failure, conflict, invalid, not_found
from gpufleet.server.services.auth import Principal, Refused
from gpufleet.server.store.db import Database
from gpufleet.server.store.dispatch import touch
from gpufleet.server.store.models import Allocation, Job, JobStep, JobStepOutput, JobStepTask, User
from gpufleet.server.store.tokenkey import TokenHasher

PREFIX = "gfj."
OUTPUT_MAX_BYTES = 16 * 1024 * 1024
"""What is kept of one task's output (more is acknowledged and dropped, with a line)."""
FOLLOW_MAX_CHARS = 1024 * 1024
"""At most this much output in one ``show_step`` answer (``srun`` asks again at once)."""
TRUNCATED = "gpufleet: this task's output is cut here (more than 16 MiB)\n"


# -- the job's credential --------------------------------------------------------------------------


def _mac(hasher: TokenHasher, job_id: int, attempt: int) -> str:
    return hasher.digest(f"gpufleet job credential v1:{job_id}:{attempt}")[:43]


def job_credential(hasher: TokenHasher, job_id: int, attempt: int) -> str:
    return f"{PREFIX}{job_id}.{attempt}.{_mac(hasher, job_id, attempt)}"


def with_credentials(reply: SyncReply, hasher: TokenHasher) -> SyncReply:
    """``reply`` with each desired job's credential filled in (the agent puts it in the
    job's environment)."""
    if not reply.jobs:
        return reply
    jobs = [
        d.model_copy(update={"credential": job_credential(hasher, d.job_id, d.attempt)}) for d in reply.jobs
    ]
    return reply.model_copy(update={"jobs": jobs})


UNKNOWN_JOB = Refused("invalid job credential")
ENDED = Refused("job credential no longer valid: its job attempt is over")


def _signed(token: str, hasher: TokenHasher) -> tuple[int, int] | None:
    """(job, attempt) of a credential this server's key signed, else None (pure: no
    database)."""
    parts = token[len(PREFIX) :].split(".") if token.startswith(PREFIX) else []
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    job_id, attempt = int(parts[0]), int(parts[1])
    if job_id > 2**31 - 1 or not hmac.compare_digest(parts[2], _mac(hasher, job_id, attempt)):
        return None
    return job_id, attempt


def signed_job_credential(token: str, hasher: TokenHasher) -> bool:
    """True for a job credential this server signed (live or not): the failed-login
    throttle lets it through to the look-up, as it does a known token's digest, so a
    job's ``srun`` is never refused because its address is throttled; a forged one
    costs no database read."""
    return _signed(token, hasher) is not None


def check_job_credential(db: Database, token: str, hasher: TokenHasher) -> Principal | Refused:
    """The job's owner (role ``user``) for a live job credential, else why not. Looked up
    every time (never cached: the job's end must end it at once)."""
    signed = _signed(token, hasher)
    if signed is None:
        return UNKNOWN_JOB
    job_id, attempt = signed
    with db.read() as s:
        row = s.execute(
            select(Job.state, Job.scheduled_at, Job.stopping_on, Job.stopping_attempt, User.id, User.name)
            .join(User, User.id == Job.user_id)
            .where(Job.id == job_id)
        ).first()
    if row is None:
        return UNKNOWN_JOB
    live = JobState(row.state) in ACTIVE and attempt_of(row.scheduled_at) == attempt
    stopping = row.stopping_on is not None and row.stopping_attempt == attempt
    if not (live or stopping):
        return ENDED
    return Principal(user_id=row.id, name=row.name, role="user", job=job_id)


# -- layout ------------------------------------------------------------------------------------------


def layout(
    alloc_nodes: Sequence[str], spec: StepIn, job_ntasks: int | None = None
) -> list[list[object]] | str:
    """``[[node, tasks], ...]`` for ``spec`` over the allocation's nodes (in placement
    order, the batch host first), Slurm's block distribution; or why it cannot be."""
    have = len(alloc_nodes)
    if spec.nodes is not None and spec.nodes > have:
        return f"-N {spec.nodes}: the allocation has {have} node{'s' if have != 1 else ''}"
    per = spec.ntasks_per_node
    if spec.ntasks is not None:
        ntasks = spec.ntasks
        n = spec.nodes or min(have, ntasks if per is None else -(-ntasks // per))
    elif per is not None:
        n = spec.nodes or have
        ntasks = per * n
    elif spec.nodes is not None:
        n = ntasks = spec.nodes
    else:
        n = have
        ntasks = max(job_ntasks or have, have)
    if ntasks < n:
        n = ntasks  # Slurm: fewer tasks than nodes takes fewer nodes (with a warning)
    if per is not None and ntasks > per * n:
        return f"{ntasks} tasks do not fit {n} node(s) at --ntasks-per-node={per}"
    if per is not None:
        counts = [min(per, max(0, ntasks - i * per)) for i in range(n)]
        counts = [c for c in counts if c > 0]
    else:
        base, extra = divmod(ntasks, n)
        counts = [base + (1 if i < extra else 0) for i in range(n)]
    return [[node, c] for node, c in zip(alloc_nodes, counts, strict=False)]


# -- srun's side ---------------------------------------------------------------------------------


def _job_for(s: Session, actor: Principal, job_id: int) -> Job | Failure:
    job = s.get(Job, job_id)
    if job is None or (not actor.is_operator and job.user_id != actor.user_id):
        return not_found(f"no job {job_id}")
    return job


def _alloc_nodes(s: Session, job_id: int) -> list[str]:
    seen: dict[str, None] = {}
    for node in s.scalars(select(Allocation.node).where(Allocation.job_id == job_id).order_by(Allocation.id)):
        seen.setdefault(node, None)
    return list(seen)


def create_step(
    *, db: Database, actor: Principal, job_id: int, spec: StepIn, now: float
) -> StepOut | Failure:
    """The step, numbered after the job's last: several ``srun`` of one job at once (``srun
    ... &``) may take the same number, and all but one are refused by the unique (job,
    step) at commit: they try again with the next (a few times, then 409)."""
    for _ in range(8):
        try:
            return _create_step(db=db, actor=actor, job_id=job_id, spec=spec, now=now)
        except IntegrityError:
            continue
    return conflict(f"job {job_id}: too many steps started at once; try again")


def _create_step(
    *, db: Database, actor: Principal, job_id: int, spec: StepIn, now: float
) -> StepOut | Failure:
    with db.write() as s:
        job = _job_for(s, actor, job_id)
        if isinstance(job, Failure):
            return job
        if JobState(job.state) not in ACTIVE:
            return conflict(f"job {job_id} is {job.state}: steps run only inside a running job")
        nodes = _alloc_nodes(s, job_id)
        if not nodes:
            return conflict(f"job {job_id} holds no node")
        try:
            job_ntasks = int(str(job.env.get("SLURM_NTASKS", ""))) if job.env.get("SLURM_NTASKS") else None
        except ValueError:
            job_ntasks = None
        if job_ntasks is None and job.ntasks_per_node:
            job_ntasks = job.ntasks_per_node * len(nodes)
        where = layout(nodes, spec, job_ntasks)
        if isinstance(where, str):
            return invalid(where)
        last = s.scalar(select(func.max(JobStep.step)).where(JobStep.job_id == job_id))
        number = 0 if last is None else last + 1
        if number >= MAX_STEPS:
            return conflict(f"job {job_id} has {MAX_STEPS} steps already")
        options = {
            "gpus_per_task": spec.gpus_per_task or 0,
            "cpus_per_task": spec.cpus_per_task or 0,
            "kill_on_bad_exit": spec.kill_on_bad_exit,
            "workdir": spec.workdir,
        }
        step = JobStep(
            job_id=job_id,
            step=number,
            attempt=attempt_of(job.scheduled_at),
            name=spec.name or (spec.command[0].rsplit("/", 1)[-1][:128] if spec.command else ""),
            command=list(spec.command),
            env=dict(spec.env),
            layout=where,
            options=options,
            state="RUNNING",
            stopping=False,
            created_at=now,
        )
        s.add(step)
        s.flush()
        procid = 0
        for node, count in where:
            for _ in range(int(str(count))):
                s.add(JobStepTask(step_id=step.id, procid=procid, node=str(node), output_end=0, killed=False))
                procid += 1
        s.flush()
        touch(s, [str(n) for n, _ in where])
        return _out(s, step, job, after=None)


def show_step(
    *, db: Database, actor: Principal, job_id: int, step: int, after: int | None
) -> StepOut | Failure:
    with db.read() as s:
        job = _job_for(s, actor, job_id)
        if isinstance(job, Failure):
            return job
        row = s.scalar(select(JobStep).where(JobStep.job_id == job_id, JobStep.step == step))
        if row is None:
            return not_found(f"no step {job_id}.{step}")
        return _out(s, row, job, after=after)


def list_steps(*, db: Database, actor: Principal, job_id: int) -> StepList | Failure:
    with db.read() as s:
        job = _job_for(s, actor, job_id)
        if isinstance(job, Failure):
            return job
        rows = s.scalars(select(JobStep).where(JobStep.job_id == job_id).order_by(JobStep.step))
        return StepList(steps=[_out(s, r, job, after=None, tasks=False) for r in rows])


def steps_of_jobs(*, db: Database, actor: Principal, job_ids: Sequence[int]) -> StepList:
    """The steps of these jobs the caller may see (``gpufleet history``: one request for
    all its jobs), by job and step."""
    with db.read() as s:
        q = select(JobStep, Job).join(Job, Job.id == JobStep.job_id).where(JobStep.job_id.in_(set(job_ids)))
        if not actor.is_operator:
            q = q.where(Job.user_id == actor.user_id)
        rows = s.execute(q.order_by(JobStep.job_id, JobStep.step)).all()
        return StepList(steps=[_out(s, st, job, after=None, tasks=False) for st, job in rows])


def cancel_step(*, db: Database, actor: Principal, job_id: int, step: int, now: float) -> StepOut | Failure:
    """Stop the step's tasks (``srun`` got SIGINT/SIGTERM, or ``scancel JOB.STEP``)."""
    with db.write() as s:
        job = _job_for(s, actor, job_id)
        if isinstance(job, Failure):
            return job
        row = s.scalar(select(JobStep).where(JobStep.job_id == job_id, JobStep.step == step))
        if row is None:
            return not_found(f"no step {job_id}.{step}")
        if row.state == "RUNNING" and not row.stopping:
            row.stopping = True
            row.options = {**row.options, "cancelled": True}
            touch(s, [str(n) for n, _ in row.layout])
            _settle(s, row, now)
        return _out(s, row, job, after=None)


def _state(step: JobStep, job: Job) -> str:
    """The step's state as shown: a RUNNING step of a job (attempt) that is over is
    CANCELLED (its tasks ended with the job)."""
    if step.state != "RUNNING":
        return step.state
    if JobState(job.state) not in ACTIVE or attempt_of(job.scheduled_at) != step.attempt:
        return "CANCELLED"
    return "RUNNING"


def _out(s: Session, step: JobStep, job: Job, *, after: int | None, tasks: bool = True) -> StepOut:
    where = [(str(n), int(str(c))) for n, c in step.layout]
    task_rows: list[StepTaskOut] = []
    if tasks:
        for t in s.scalars(
            select(JobStepTask).where(JobStepTask.step_id == step.id).order_by(JobStepTask.procid)
        ):
            task_rows.append(
                StepTaskOut(
                    procid=t.procid,
                    node=t.node,
                    state="RUNNING" if t.exit_code is None else "EXITED",
                    exit_code=t.exit_code,
                )
            )
    output: list[StepChunk] = []
    if after is not None:
        size = 0
        q = (
            select(JobStepOutput)
            # piece ids are 32-bit: a client's larger ``after`` (up to 2**63-1) means "after
            # all of them", and PostgreSQL refuses an int4 compared with it (a 500, by fuzzing)
            .where(JobStepOutput.step_id == step.id, JobStepOutput.id > min(after, INT32))
            .order_by(JobStepOutput.id)
        )
        for c in s.scalars(q.limit(1000)):
            output.append(StepChunk(id=c.id, procid=c.procid, data=c.data))
            size += len(c.data)
            if size >= FOLLOW_MAX_CHARS:
                break
    return StepOut(
        id=f"{step.job_id}.{step.step}",
        job_id=step.job_id,
        step=step.step,
        name=step.name,
        command=list(step.command),
        state=_state(step, job),  # type: ignore[arg-type]
        exit_code=step.exit_code,
        ntasks=sum(c for _, c in where),
        nodes=[n for n, _ in where],
        tasks_per_node=[c for _, c in where],
        created_at=step.created_at,
        ended_at=step.ended_at,
        job_state=job.state,
        tasks=task_rows,
        output=output,
    )


# -- the agents' side ---------------------------------------------------------------------------


def desired_steps(s: Session, node: str, attempts: dict[int, int]) -> dict[int, list[DesiredStep]]:
    """Job id -> the step tasks ``node`` should run for these job attempts: those of
    steps still running (not stopping) that have not reported an exit."""
    if not attempts:
        return {}
    q = (
        select(JobStep, JobStepTask.procid)
        .join(JobStepTask, JobStepTask.step_id == JobStep.id)
        .where(
            JobStep.job_id.in_(attempts),
            JobStep.state == "RUNNING",
            JobStep.stopping.is_(False),
            JobStepTask.node == node,
            JobStepTask.exit_code.is_(None),
        )
        .order_by(JobStep.id, JobStepTask.procid)
    )
    procids: dict[int, list[int]] = defaultdict(list)
    steps: dict[int, JobStep] = {}
    for step, procid in s.execute(q):
        if attempts.get(step.job_id) != step.attempt:
            continue
        steps[step.id] = step
        procids[step.id].append(procid)
    out: dict[int, list[DesiredStep]] = defaultdict(list)
    for sid, step in steps.items():
        where = [(str(n), int(str(c))) for n, c in step.layout]
        names = [n for n, _ in where]
        opts = step.options
        out[step.job_id].append(
            DesiredStep(
                step=step.step,
                command=list(step.command),
                env={str(k): str(v) for k, v in step.env.items()},
                workdir=opts.get("workdir"),
                procids=procids[sid],
                node_index=names.index(node) if node in names else 0,
                ntasks=sum(c for _, c in where),
                nodes=names,
                tasks_per_node=[c for _, c in where],
                gpus_per_task=int(opts.get("gpus_per_task") or 0),
                cpus_per_task=int(opts.get("cpus_per_task") or 0),
            )
        )
    return dict(out)


def ingest_tasks(s: Session, node: str, items: Iterable[StepTaskIn], now: float) -> list[StepAck]:
    """Store what ``node`` reports of its step tasks (only tasks laid out on it): output
    appended when it continues the stored output, an exit recorded once; a step whose
    tasks are all over is settled, one with ``--kill-on-bad-exit`` stopped at the first
    bad exit. Returns how far each task's output is stored."""
    acks: list[StepAck] = []
    items = list(items)
    if not items:
        return acks
    keys = {(i.job_id, i.step) for i in items}
    steps = {
        (st.job_id, st.step): st
        for st in s.scalars(select(JobStep).where(JobStep.job_id.in_({k[0] for k in keys})))
        if (st.job_id, st.step) in keys
    }
    tasks = {
        (t.step_id, t.procid): t
        for t in s.scalars(
            select(JobStepTask).where(
                JobStepTask.step_id.in_([st.id for st in steps.values()]), JobStepTask.node == node
            )
        )
    }
    dirty: dict[int, JobStep] = {}
    for i in items:
        step = steps.get((i.job_id, i.step))
        task = None if step is None else tasks.get((step.id, i.procid))
        if step is None or task is None:
            continue  # not this node's to speak for
        if i.offset == task.output_end and i.end >= i.offset:
            if i.data:
                kept = task.output_end < OUTPUT_MAX_BYTES
                data = i.data if kept else ""
                if kept and i.end > OUTPUT_MAX_BYTES:
                    data += "\n" + TRUNCATED
                if data:
                    s.add(JobStepOutput(step_id=step.id, procid=task.procid, data=data))
            task.output_end = i.end
        complete = i.offset <= task.output_end and i.end == task.output_end
        if i.state == "exited" and task.exit_code is None and complete:
            task.exit_code = i.exit_code if i.exit_code is not None else -1
            task.killed = i.killed
            dirty[step.id] = step
        acks.append(
            StepAck(
                job_id=i.job_id,
                step=i.step,
                procid=i.procid,
                end=task.output_end,
                done=task.exit_code is not None,
            )
        )
    s.flush()
    for step in dirty.values():
        _settle(s, step, now)
    return acks


def _settle(s: Session, step: JobStep, now: float) -> None:
    """A step whose tasks are all over gets its final state; a bad exit under
    ``--kill-on-bad-exit`` stops the rest (their nodes are rung)."""
    if step.state != "RUNNING":
        return
    rows = list(
        s.execute(select(JobStepTask.exit_code, JobStepTask.killed).where(JobStepTask.step_id == step.id))
    )
    own = [code for code, killed in rows if code is not None and not killed]
    if step.options.get("kill_on_bad_exit") and not step.stopping and any(code != 0 for code in own):
        step.stopping = True
        touch(s, [str(n) for n, _ in step.layout])
    if any(code is None for code, _ in rows):
        return
    step.exit_code = max(own) if own else max((c for c, _ in rows if c is not None), default=0)
    job = s.get(Job, step.job_id)
    over = job is None or JobState(job.state) not in ACTIVE or attempt_of(job.scheduled_at) != step.attempt
    cancelled = bool(step.options.get("cancelled")) or over  # ended with its job (a cancel, a limit)
    step.state = "CANCELLED" if cancelled else ("COMPLETED" if step.exit_code == 0 and own else "FAILED")
    step.ended_at = now
