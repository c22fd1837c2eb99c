"""Jobs after submission (``submissions.py``): list, show, cancel, hold, release, priority,
requeue and update (Slurm's ``scontrol requeue`` and ``scontrol update``).

Visibility: a plain user sees only their own jobs; another user's job answers 404
(it is not revealed that the id exists). Operators and admins see and act on all jobs.
Changing a priority is for operators and admins (a job's owner gets 403).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic_core import to_json
from sqlalchemy import ColumnElement, or_, select
from sqlalchemy.orm import Session

from gpufleet.api.jobs import (
    AllocationOut,
    Cancelled,
    CancelMany,
    JobDetail,
    JobDiagnosis,
    JobEventOut,
    JobUpdate,
)
from gpufleet.server.errors import Conflict
from gpufleet.server.jobstate.states import ACTIVE, TERMINAL, JobState
from gpufleet.server.jobstate.transitions import move, ref, release_attempt
from gpufleet.server.problems import Failure, conflict, forbidden, invalid, not_found
from gpufleet.server.services import arraylist, bulkjobs
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.submitopts import time_limit
from gpufleet.server.store import effects
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import Allocation, Job, JobEvent, Team, User
from gpufleet.timefmt import format_duration

# -- reading -----------------------------------------------------------------------------------


def _allocs(s: Session, ids: Sequence[int]) -> dict[int, list[AllocationOut]]:
    if not ids:
        return {}
    per: dict[int, dict[str, list[int]]] = {}
    q = select(Allocation.job_id, Allocation.node, Allocation.gpu_index).where(Allocation.job_id.in_(ids))
    for jid, node, idx in s.execute(q):
        gpus = per.setdefault(jid, {}).setdefault(node, [])
        if idx is not None:
            gpus.append(idx)
    return {
        jid: [AllocationOut(node=n, gpus=sorted(g)) for n, g in sorted(nodes.items())]
        for jid, nodes in per.items()
    }


def _fields(job: Job, user: str, team: str, alloc: list[AllocationOut]) -> dict[str, Any]:
    """A job's listed fields (``_listed`` makes the same of a list's rows)."""
    return {
        "id": job.id,
        "name": job.name,
        "user": user,
        "team": team,
        "pool": job.pool,
        "state": job.state,
        "gpus": job.gpus,
        "gpus_per_node": job.gpus_per_node,
        "nodes": job.nodes,
        "gpu_type": job.gpu_type,
        "priority": job.priority,
        "time_limit_s": job.time_limit_s,
        "command": job.command,
        "image": job.image,
        "requeue": job.requeue,
        "max_attempts": job.max_attempts,
        "attempts": job.attempts,
        "submit_time": job.submit_time,
        "scheduled_at": job.scheduled_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "exit_code": job.exit_code,
        "attained_service_s": job.attained_service_s,
        "queue_position": job.queue_position if job.state == JobState.PENDING else None,
        "estimated_start": job.estimated_start if job.state == JobState.PENDING else None,
        "wait_reason": job.wait_reason if job.state in (JobState.PENDING, JobState.HELD) else None,
        "allocation": alloc,
        "reservation": job.reservation_id,
        "cost": round(job.cost, 6),
        "energy_kwh": round(job.energy_wh / 1000.0, 6),
        "array_job_id": job.array_job_id,
        "array_task_id": job.array_task_id,
        "dependency": job.dependency,
        "cpus_per_node": job.cpus_per_node,
        "mem_per_node_mb": job.mem_per_node_mb,
        "begin_at": job.begin_at,
        "deadline": job.deadline,
        "max_price": job.max_price,
        "qos": job.qos,
        "licenses": job.licenses,
        "cuda": job.cuda,
        "predicted_s": job.predicted_s,
        "prediction_confidence": job.predicted_conf,
        "prediction_basis": job.prediction_basis,
        "predicted_end": predicted_end(
            state=job.state,
            started_at=job.started_at,
            executed_s=job.executed_s,
            predicted_s=job.predicted_s,
            time_limit_s=job.time_limit_s,
        ),
    }


def _detail(
    s: Session,
    job: Job,
    *,
    user: str,
    team: str,
    events: list[dict[str, Any]] | None = None,
    alloc: list[AllocationOut] | None = None,
) -> JobDetail:
    if events is None:
        q = select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.id)
        evs = [JobEventOut.model_validate(e, from_attributes=True) for e in s.scalars(q)]
    else:
        evs = [JobEventOut.model_validate(e) for e in events]
    if alloc is None:
        alloc = _allocs(s, [job.id]).get(job.id, [])
    return JobDetail(
        **_fields(job, user, team, alloc),
        env=job.env,
        output=job.output,
        error=job.error,
        events=evs,
        input=job.input,
        submit_dir=job.submit_dir,
        workdir=job.workdir,
        signal=job.signal,
        checkpoint_s=job.checkpoint_s,
        cpus_per_task=job.cpus_per_task,
        ntasks_per_node=job.ntasks_per_node,
        diagnosis=_diagnosis(job.diagnosis),
    )


def predicted_end(
    *,
    state: str,
    started_at: float | None,
    executed_s: float,
    predicted_s: float | None,
    time_limit_s: float | None,
) -> float | None:
    """When a running job is predicted to end: its attempt's start plus what its
    prediction leaves after its earlier attempts (``executed_s``), within its time limit
    (``loops/history.py`` predicts)."""
    if state != JobState.RUNNING or started_at is None or predicted_s is None:
        return None
    left = max(0.0, predicted_s - executed_s)
    if time_limit_s is not None and time_limit_s > 0:
        left = min(left, time_limit_s)
    return started_at + left


def _diagnosis(stored: dict[str, Any] | None) -> JobDiagnosis | None:
    """``Job.diagnosis`` as the API shows it (a row it cannot read: none)."""
    if not stored:
        return None
    try:
        return JobDiagnosis.model_validate(stored)
    except ValueError:
        return None


def _load(s: Session, actor: Principal, job_id: int) -> tuple[Job, str, str] | Failure:
    row = s.execute(
        select(Job, User.name, Team.name)
        .join(User, User.id == Job.user_id)
        .join(Team, Team.id == Job.team_id)
        .where(Job.id == job_id)
    ).first()
    if row is None or (not actor.is_operator and row[0].user_id != actor.user_id):
        return not_found(f"no job {job_id}")
    job, user, team = row
    return job, user, team


def show(*, db: Database, actor: Principal, job_id: int) -> JobDetail | Failure:
    with db.read() as s:
        found = _load(s, actor, job_id)
        if isinstance(found, Failure):
            return found
        job, user, team = found
        return _detail(s, job, user=user, team=team)


_LISTED = (
    Job.id,
    Job.name,
    User.name.label("user"),
    Team.name.label("team"),
    Job.pool,
    Job.state,
    Job.gpus,
    Job.gpus_per_node,
    Job.nodes,
    Job.gpu_type,
    Job.priority,
    Job.time_limit_s,
    Job.command,
    Job.image,
    Job.requeue,
    Job.max_attempts,
    Job.attempts,
    Job.submit_time,
    Job.scheduled_at,
    Job.started_at,
    Job.ended_at,
    Job.exit_code,
    Job.attained_service_s,
    Job.queue_position,
    Job.estimated_start,
    Job.wait_reason,
    # allocation: the rows of ``_allocs``
    Job.reservation_id.label("reservation"),
    Job.cost,
    Job.energy_wh,
    # warnings: none in a list
    Job.array_job_id,
    Job.array_task_id,
    Job.dependency,
    Job.cpus_per_node,
    Job.mem_per_node_mb,
    Job.begin_at,
    Job.deadline,
    Job.max_price,
    Job.qos,
    Job.licenses,
    Job.cuda,
    Job.predicted_s,
    Job.predicted_conf.label("prediction_confidence"),
    Job.prediction_basis,
    Job.executed_s,  # not shown: what ``predicted_end`` is made of (with the above)
)
"""What a list shows, in ``JobOut``'s field order and named as its fields, read as plain
rows: a page of 1,000 jobs is the API's heaviest read, and ORM objects (with ``env`` and
the bookkeeping columns) and per-attribute access cost several times more than
``dict(zip())``."""
_LIST_Q = select(*_LISTED).join_from(Job, User, User.id == Job.user_id).join(Team, Team.id == Job.team_id)
_LIST_KEYS = tuple(_LIST_Q.selected_columns.keys())
_HEAD = _LIST_KEYS.index("reservation")
_HEAD_KEYS = _LIST_KEYS[:_HEAD]
_TAIL_KEYS = _LIST_KEYS[_HEAD + 3 : -1]  # after reservation, cost and energy_wh; before executed_s
_PENDING = str(JobState.PENDING)
_WAITING = frozenset({_PENDING, str(JobState.HELD)})


def _listed(row: Sequence[Any], alloc: list[AllocationOut]) -> dict[str, Any]:
    """``_fields`` for a row of ``_LIST_Q``: ``JobOut``'s fields in its order (a test
    holds them to it), so that the page is written as JSON as ``JobOut`` would write it."""
    f = dict(zip(_HEAD_KEYS, row, strict=False))
    state = f["state"]
    if state != _PENDING:
        f["queue_position"] = f["estimated_start"] = None
    if state not in _WAITING:
        f["wait_reason"] = None
    f["allocation"] = alloc
    f["reservation"] = row[_HEAD]
    f["cost"] = round(row[_HEAD + 1], 6)
    f["energy_kwh"] = round(row[_HEAD + 2] / 1000.0, 6)
    f["warnings"] = []
    f.update(zip(_TAIL_KEYS, row[_HEAD + 3 : -1], strict=True))
    f["predicted_end"] = predicted_end(
        state=state,
        started_at=f["started_at"],
        executed_s=row[-1],
        predicted_s=f["predicted_s"],
        time_limit_s=f["time_limit_s"],
    )
    return f


def list_jobs(
    *,
    db: Database,
    actor: Principal,
    states: Sequence[JobState] = (),
    user: str | None = None,
    team: str | None = None,
    pool: str | None = None,
    array: int | None = None,
    ids: Sequence[int] | None = None,
    since: float | None = None,
    until: float | None = None,
    limit: int = 100,
    cursor: int | None = None,
    offset: int | None = None,
    collapse: bool = False,
) -> bytes:
    """A ``JobPage`` of jobs in id order, as JSON. Page with ``cursor`` (the previous
    page's ``next_cursor``: stable under concurrent submits) or ``offset``. ``array``:
    that array's tasks. ``ids``: these jobs and the tasks of arrays of these ids (none
    when empty). ``since`` and ``until`` (``sacct -S -E``): jobs in the system at
    some time in that window, i.e. submitted by ``until`` and not ended before ``since``.
    ``collapse``: an array's tasks that wait in one state are one item, with
    ``array_tasks`` and ``array_task_count`` (``arraylist.py``; squeue's pending array).

    The rows are written as JSON straight from the database's values (pydantic-core's
    ``to_json``, the serialiser ``JobOut`` uses), not validated as ``JobOut`` first: the
    columns already have the fields' types (Float columns read as float, Boolean as bool),
    and validating then dumping a page of 1,000 cost ~9 ms of the ~20 ms it takes
    (issue 31's fast ``gpufleet queue``). A test checks pages against ``JobOut``."""
    conds: list[ColumnElement[bool]] = []
    if not actor.is_operator:
        conds.append(Job.user_id == actor.user_id)
    if states:
        conds.append(Job.state.in_([str(st) for st in states]))
    if user is not None:
        conds.append(User.name == user)
    if team is not None:
        conds.append(Team.name == team)
    if pool is not None:
        conds.append(Job.pool == pool)
    if array is not None:
        conds.append(Job.array_job_id == array)
    if ids is not None:
        conds.append(or_(Job.id.in_(ids), Job.array_job_id.in_(ids)))
    if since is not None:
        conds.append(or_(Job.ended_at.is_(None), Job.ended_at >= since))
    if until is not None:
        conds.append(Job.submit_time <= until)
    q = _LIST_Q.where(*conds, *([arraylist.folded(conds)] if collapse else []))
    if cursor is not None:
        q = q.where(Job.id > cursor)
    q = q.order_by(Job.id).limit(limit + 1)
    if offset:
        q = q.offset(offset)
    with db.read() as s:
        rows = s.connection().execute(q).all()
        more = len(rows) > limit
        rows = rows[:limit]
        allocs = _allocs(s, [r[0] for r in rows])
        items = [_listed(r, allocs.get(r[0], [])) for r in rows]
        if collapse:
            arraylist.fold_items(s, conds, items)
    page = {"items": items, "next_cursor": str(items[-1]["id"]) if more and items else None, "total": None}
    return to_json(page)


# -- changing ----------------------------------------------------------------------------------


Decision = Callable[[Session, Job], tuple[JobState, str, dict[str, Any]] | Failure]
"""What ``_change`` asks: the transition for a job (state, reason, column values), or why not."""


def _change(
    db: Database,
    actor: Principal,
    job_id: int,
    now: float,
    decide: Decision,
    *,
    via: JobState | None = None,
    wake: bool = True,
) -> JobDetail | Failure:
    """Load, let ``decide`` pick the transition, apply it with CAS (a few retries when the
    scheduler changed the job meanwhile), and return the job as it is afterwards.
    ``via``: a transit state on the way (REQUEUED). ``wake``: the scheduler is woken once
    the change has committed (``effects.py``), as what it may place has changed."""
    for _ in range(5):
        try:
            with db.write() as s:
                found = _load(s, actor, job_id)
                if isinstance(found, Failure):
                    return found
                job, user, team = found
                decided = decide(s, job)
                if isinstance(decided, Failure):
                    return decided
                to, reason, values = decided
                move(s, ref(job), to, actor=actor.name, reason=reason, now=now, values=values, via=via)
                if wake:
                    effects.wake_scheduler(s)
                s.expire(job)
                return _detail(s, job, user=user, team=team)
        except Conflict:
            continue
    return conflict(f"job {job_id} is changing too fast; try again")


def _cancelling(actor: Principal, now: float) -> Decision:
    """``_change``'s decision for a cancel (one job, or each of ``cancel_many``'s)."""

    def decide(s: Session, job: Job) -> tuple[JobState, str, dict[str, Any]] | Failure:
        if JobState(job.state) in TERMINAL:
            return conflict(f"job {job.id} already finished ({job.state})")
        return (
            JobState.CANCELLED,
            f"cancelled by {actor.name}",
            release_attempt(s, job, now=now, confirmed=False) | {"ended_at": now},
        )

    return decide


def cancel(*, db: Database, actor: Principal, job_id: int, now: float) -> JobDetail | Failure:
    return _change(db, actor, job_id, now, _cancelling(actor, now))


def cancel_many(
    *, db: Database, actor: Principal, spec: CancelMany, states: Sequence[JobState], now: float
) -> Cancelled | Failure:
    """Cancel every job the filters match: ``scancel`` with filters, a whole array, or a
    list of ids. The waiting ones (PENDING, HELD: most of an array) in one transaction of
    a few statements (``bulkjobs.cancel_waiting``); then each scheduled or running one
    (and a waiting one those statements missed) in its own small transaction, the way
    ``cancel`` does it (its GPUs released, its cost closed, its agents told; a job the
    scheduler changes meanwhile is retried, then skipped)."""
    match = bulkjobs.Match(ids=spec.ids, array=spec.array, user=spec.user, states=states, name=spec.name)
    conds = bulkjobs.where(actor, match)
    if isinstance(conds, Failure):
        return conds
    with db.write() as s:
        done = bulkjobs.cancel_waiting(s, conds, actor=actor.name, now=now)
    with db.read() as s:  # and any waiting job the bulk statements missed (bulkjobs.cancel_waiting)
        active = bulkjobs.matching(s, conds, [JobState(st) for st in bulkjobs.LIVE])
    skipped: list[int] = []
    decide = _cancelling(actor, now)
    for jid in active:
        out = _change(db, actor, jid, now, decide)
        (skipped if isinstance(out, Failure) else done).append(jid)
    return Cancelled(cancelled=sorted(done), skipped=skipped)


def hold(*, db: Database, actor: Principal, job_id: int, now: float) -> JobDetail | Failure:
    def decide(s: Session, job: Job) -> tuple[JobState, str, dict[str, Any]] | Failure:
        if job.state != JobState.PENDING:
            return conflict(f"only a PENDING job can be held; job {job.id} is {job.state}")
        return JobState.HELD, f"held by {actor.name}", {"wait_reason": f"JobHeldUser: held by {actor.name}"}

    return _change(db, actor, job_id, now, decide, wake=False)  # a held job frees nothing


def release(*, db: Database, actor: Principal, job_id: int, now: float) -> JobDetail | Failure:
    def decide(s: Session, job: Job) -> tuple[JobState, str, dict[str, Any]] | Failure:
        if job.state != JobState.HELD:
            return conflict(f"only a HELD job can be released; job {job.id} is {job.state}")
        return JobState.PENDING, f"released by {actor.name}", {"wait_reason": None}

    return _change(db, actor, job_id, now, decide)


def set_priority(
    *, db: Database, actor: Principal, job_id: int, priority: int, now: float
) -> JobDetail | Failure:
    """Recorded as an event with from_state == to_state (an audit row, not a move)."""

    def decide(s: Session, job: Job) -> tuple[JobState, str, dict[str, Any]] | Failure:
        if not actor.is_operator:
            return forbidden("only operators and admins change priorities")
        if JobState(job.state) in TERMINAL:
            return conflict(f"job {job.id} already finished ({job.state})")
        reason = f"priority {job.priority} -> {priority} by {actor.name}"
        return JobState(job.state), reason, {"priority": priority}

    return _change(db, actor, job_id, now, decide)


def requeue(*, db: Database, actor: Principal, job_id: int, now: float) -> JobDetail | Failure:
    """``scontrol requeue``: a SCHEDULED or RUNNING job stops (its nodes are told) and
    goes back to PENDING through REQUEUED, keeping its id, history and GPU-seconds; it
    is placed again once its nodes confirmed the old attempt stopped. A requeue asked
    for is not a failure: ``attempts`` (which ``--max-attempts`` counts) is unchanged.
    Refused (409): a job submitted with ``--no-requeue`` (as Slurm refuses it), one
    that is waiting, and one that has ended (the state machine has no way back from an
    end: submit it again)."""

    def decide(s: Session, job: Job) -> tuple[JobState, str, dict[str, Any]] | Failure:
        state = JobState(job.state)
        if state in TERMINAL:
            return conflict(
                f"job {job.id} has ended ({job.state}): only a scheduled or running job is requeued; "
                "submit it again"
            )
        if state not in ACTIVE:
            return conflict(f"job {job.id} is {job.state}: it is waiting already, nothing to requeue")
        if not job.requeue:
            return conflict(f"job {job.id} was submitted with --no-requeue")
        values = release_attempt(s, job, now=now, confirmed=False) | {
            "ended_at": None,
            "pending_since": now,
            "scheduled_at": None,
            "started_at": None,
            "not_before": None,
            "wait_reason": None,
        }
        return JobState.PENDING, f"requeued by {actor.name}", values

    return _change(db, actor, job_id, now, decide, via=JobState.REQUEUED)


def update(
    *, db: Database, actor: Principal, job_id: int, spec: JobUpdate, now: float
) -> JobDetail | Failure:
    """``scontrol update``: a new time limit (down only, except for operators, as in
    Slurm), a new name, held or released; one event records every change. Refused: an
    ended job (409), nothing to change (422)."""
    if spec.time_limit is None and spec.name is None and spec.held is None:
        return invalid("say what to change: time_limit, name or held")
    limit = time_limit(spec.time_limit)
    if isinstance(limit, Failure):
        return limit

    def decide(s: Session, job: Job) -> tuple[JobState, str, dict[str, Any]] | Failure:
        state = JobState(job.state)
        if state in TERMINAL:
            return conflict(f"job {job.id} already finished ({job.state})")
        values: dict[str, Any] = {}
        said: list[str] = []
        if limit is not None:
            now_limit = job.time_limit_s
            if not actor.is_operator and now_limit is not None and limit > now_limit:
                return forbidden(
                    f"job {job.id}: a time limit only goes down ({_secs(now_limit)} now); operators raise it"
                )
            values["time_limit_s"] = limit
            said.append(f"time limit {_secs(now_limit)} -> {_secs(limit)}")
        if spec.name is not None:
            values["name"] = spec.name
            said.append(f"name {job.name!r} -> {spec.name!r}")
        to = state
        if spec.held is True and state != JobState.HELD:
            if state != JobState.PENDING:
                return conflict(f"only a PENDING job can be held; job {job.id} is {job.state}")
            to, values["wait_reason"] = JobState.HELD, f"JobHeldUser: held by {actor.name}"
            said.append("held")
        elif spec.held is False and state == JobState.HELD:
            to, values["wait_reason"] = JobState.PENDING, None
            said.append("released")
        return to, f"{'; '.join(said) or 'nothing changed'} by {actor.name}", values

    return _change(db, actor, job_id, now, decide)


def _secs(limit: float | None) -> str:
    return "none" if limit is None else format_duration(limit)
