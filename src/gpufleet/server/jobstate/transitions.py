"""Compare-and-set job transitions, each written with its job-event row.

Every change of a job's state goes through ``move``: one ``UPDATE ... WHERE id=:id AND
version=:v AND state=:s`` plus the event insert, inside the caller's transaction. When
the row changed underneath (rowcount 0) nothing is written; the caller rolls back and
retries with fresh state, or reports a conflict. Version 0 is a
valid version: it is compared, never tested for truth.

``move`` raises ``errors.Conflict`` when the row changed underneath (rowcount 0) and
writes nothing; the caller's transaction rolls back.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session

from gpufleet.server.errors import Conflict, IllegalTransition
from gpufleet.server.jobstate.states import ACTIVE, JobState, allowed
from gpufleet.server.store import ledger
from gpufleet.server.store.dispatch import touch
from gpufleet.server.store.leader import EPOCH
from gpufleet.server.store.models import Allocation, Job, JobEvent, stopping_value


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRef:
    """What a CAS needs to know about a job as the caller last saw it."""

    id: int
    state: JobState
    version: int


def ref(job: Job) -> JobRef:
    return JobRef(id=job.id, state=JobState(job.state), version=job.version)


def attempt_of(scheduled_at: float | None) -> int:
    """A job attempt's id: its placement time in milliseconds (unique per job, since a
    job is placed again only after its previous attempt was confirmed stopped)."""
    return round((scheduled_at or 0.0) * 1000)


def event_row(
    *, job_id: int, at: float, actor: str, src: JobState | None, dst: JobState, reason: str
) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "at": at,
        "actor": actor,
        "from_state": None if src is None else str(src),
        "to_state": str(dst),
        "reason": reason[:512],
    }


def move(
    s: Session,
    job: JobRef,
    to: JobState,
    *,
    actor: str,
    reason: str,
    now: float,
    via: JobState | None = None,
    values: dict[str, Any] | None = None,
) -> None:
    """Move ``job`` to ``to`` (through the transit state ``via``, e.g. PREEMPTED, whose
    event is written too; ``to == job.state`` records an audited change of ``values``).
    Raises ``Conflict``, changing nothing, if the job moved meanwhile."""
    steps = [job.state, *([via] if via is not None else []), to]
    for a, b in itertools.pairwise(steps):
        if a != b and not allowed(a, b):  # a == b: an audited change that keeps the state
            raise IllegalTransition(f"job {job.id}: {a} -> {b}")
    res = s.execute(
        update(Job)
        .where(Job.id == job.id, Job.version == job.version, Job.state == str(job.state))
        .values(state=str(to), version=Job.version + 1, **(values or {}))
        .execution_options(synchronize_session=False)
    )
    if res.rowcount != 1:  # type: ignore[attr-defined]
        raise Conflict(f"job {job.id} changed meanwhile", job_id=job.id)
    epoch = s.info.get(EPOCH)  # a leader's loop: its term's epoch (``leader.py``)
    rows = [
        event_row(job_id=job.id, at=now, actor=actor, src=a, dst=b, reason=reason) | {"epoch": epoch}
        for a, b in itertools.pairwise(steps)
    ]
    s.execute(insert(JobEvent), rows)


def release_attempt(
    s: Session,
    job: Job,
    *,
    now: float,
    confirmed: bool,
    readings: ledger.Readings = ledger.no_readings,
    confirmed_on: str | None = None,
) -> dict[str, Any]:
    """End the bookkeeping of a job's attempt as it leaves SCHEDULED/RUNNING. This
    writes (the caller's ``move`` commits it with the state change): the job's GPUs are
    released (its allocation rows deleted) and its cost stops accruing
    (``ledger.close``). Returns the column values for that ``move``: GPU-seconds and
    run time accumulated and, unless the agent confirmed the exit, its nodes recorded in
    ``stopping_on`` until they confirm (with the attempt they were told to stop).
    ``confirmed_on``: the one node that reported the exit (the other nodes of a
    multi-node job still run their part, and ship its last output, until they confirm
    too)."""
    if JobState(job.state) not in ACTIVE:
        return {}
    ledger.close(s, job.id, now, readings=readings)
    nodes = sorted(set(s.scalars(select(Allocation.node).where(Allocation.job_id == job.id))))
    s.execute(delete(Allocation).where(Allocation.job_id == job.id))
    ran = (
        max(0.0, now - job.started_at)
        if job.started_at is not None and job.state == JobState.RUNNING
        else 0.0
    )
    rest = [n for n in nodes if n != confirmed_on]
    if not confirmed:
        touch(s, rest)  # they must stop it: wake their agents after the commit
    return {
        "attained_service_s": job.attained_service_s + job.gpus * ran,
        "executed_s": job.executed_s + ran,
        "ended_at": now,
        "stopping_on": None if confirmed else stopping_value(rest),
        "stopping_attempt": attempt_of(job.scheduled_at),
        "ready": False,  # a service replica: out of the gateways with its attempt
        "endpoint": None,
        "preempt_at": None,  # a preemption's grace ends with the attempt (``preemption.py``)
        "preempt_by": None,
        "preempt_reason": None,
    }
