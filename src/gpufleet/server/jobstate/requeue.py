"""Requeue a job whose attempt failed under it (node lost, GPU fault, drain): the one
place that applies a job's requeue policy.

Policy per job (``gpufleet submit --requeue/--no-requeue --max-attempts N
--requeue-backoff D``): with ``requeue`` and fewer than ``max_attempts`` attempts so far
the job goes SCHEDULED|RUNNING -> REQUEUED -> PENDING, keeping its id, history and
GPU-seconds, with ``attempts + 1`` and ``not_before`` = now + its backoff (the first
requeue is immediate: hardware failing is not the job's fault; then ``backoff``,
doubling, at most ``MAX_BACKOFF_S``). Otherwise it becomes FAILED. Either way its GPUs
are released and every node of its placement that is still alive must confirm the
old attempt stopped (``stopping_on``) before it is placed again; a node declared lost
needs no confirmation (its processes are gone with it).
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy.orm import Session

from gpufleet.server.jobstate.states import ACTIVE, JobState
from gpufleet.server.jobstate.transitions import move, ref, release_attempt
from gpufleet.server.store.models import Job, stopping_list, stopping_value

MAX_BACKOFF_S = 600.0


def backoff_s(job: Job, requeues: int) -> float:
    """The delay before attempt ``requeues + 1`` may be placed."""
    if requeues <= 1:
        return 0.0
    return min(MAX_BACKOFF_S, job.requeue_backoff_s * 2.0 ** (requeues - 2))


def requeue(
    s: Session, job: Job, *, now: float, actor: str, reason: str, lost: Collection[str] = ()
) -> JobState | None:
    """Requeue (or fail) ``job`` inside the caller's transaction. Returns the state it
    went to, None if it is not SCHEDULED/RUNNING, and raises ``errors.Conflict`` when the job
    changed underneath (the caller rolls back and retries)."""
    if JobState(job.state) not in ACTIVE:
        return None
    vals = release_attempt(s, job, now=now, confirmed=False)
    still = [n for n in stopping_list(vals.get("stopping_on")) if n not in lost]
    vals["stopping_on"] = stopping_value(still)
    n = job.attempts + 1
    if job.requeue and n < job.max_attempts:
        vals |= {
            "ended_at": None,
            "pending_since": now,
            "scheduled_at": None,
            "started_at": None,
            "attempts": n,
            "not_before": now + backoff_s(job, n),
        }
        why = f"{reason}; requeued (attempt {n + 1} of {job.max_attempts})"
        move(
            s,
            ref(job),
            JobState.PENDING,
            via=JobState.REQUEUED,
            actor=actor,
            reason=why,
            now=now,
            values=vals,
        )
        return JobState.PENDING
    because = "--no-requeue" if not job.requeue else f"{job.max_attempts} attempts used"
    why = f"{reason}; not requeued ({because})"
    move(s, ref(job), JobState.FAILED, actor=actor, reason=why, now=now, values=vals)
    return JobState.FAILED
