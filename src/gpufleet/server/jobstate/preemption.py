"""Preemptions written back: at once, or after the victim's grace when it asked a signal.

The core decides who is preempted for whom (``scheduler/preempt.py``); this writes it.
A victim is stopped at once (RUNNING|SCHEDULED -> PREEMPTED -> PENDING, GPU-seconds kept,
its nodes told to stop), as always, unless its preemptor waits for a grace:

* A RUNNING victim with ``--signal=[B:]SIG@SECONDS`` gets the signal before it is stopped
  and SECONDS to act on it (checkpoint, exit), at most the server's
  ``--max-preempt-grace``. Its row records ``preempt_at`` (the grace's end),
  ``preempt_by`` and ``preempt_reason``, with a RUNNING -> RUNNING event that says so;
  the sync hands its agent the grace's end as the job's deadline, so the agent's
  ``--signal`` rule (``agent/jobsignal.py``) sends SIG at once (or already did, before
  its time limit: once per attempt).
* Every other RUNNING victim of the same preemptor stops at the same moment (freeing
  GPUs earlier would only let other jobs take them; the preemptor could not start
  anyway). A SCHEDULED victim, which has run nothing, still stops at once.
* The preemptor's start in this plan is dropped, and so is any start on the GPUs of a
  victim that stays: they are not free yet. Until the grace ends the snapshot keeps the
  preemptor waiting (``waiting_for``) and its victims out of the candidates.
* At the grace's end (``end_graces``, each pass) a victim still running is stopped and
  requeued as any preempted job; one that exited during its grace, whatever its exit
  code, counts as preempted too (``exited_in_grace``): it was asked to leave.

A job that leaves RUNNING another way (cancelled, timed out, lost) has its ``preempt_*``
cleared by ``release_attempt``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.server.jobstate.states import JobState
from gpufleet.server.jobstate.transitions import JobRef, move, ref, release_attempt
from gpufleet.server.store import ledger
from gpufleet.server.store.dispatch import touch
from gpufleet.server.store.models import Allocation, Job
from gpufleet.slurmopts import signal_parts


def grace_s(job: Job, max_grace_s: float) -> float:
    """Seconds ``job`` may use before a preemption stops it: its ``--signal``'s SECONDS,
    at most ``max_grace_s``; 0 when it is not RUNNING or asked no signal."""
    if job.signal is None or job.state != JobState.RUNNING or max_grace_s <= 0:
        return 0.0
    try:
        seconds = signal_parts(job.signal)[2]
    except (KeyError, ValueError):  # not parse_signal's form: no grace
        return 0.0
    return float(min(seconds, max_grace_s))


@dataclass(frozen=True, slots=True, kw_only=True)
class Victim:
    """One preemption of the plan, with the victim's row and CAS ref."""

    job: Job
    jref: JobRef
    by: str
    reason: str


def graces(victims: Iterable[Victim], preemptors: Collection[str], max_grace_s: float) -> dict[str, float]:
    """Preemptor id -> how long its victims get (the longest grace among them), for the
    preemptors that wait at all: pending jobs of the plan (not a reservation's window)
    with a RUNNING victim that asked a signal."""
    out: dict[str, float] = {}
    for v in victims:
        if v.by in preemptors:
            g = grace_s(v.job, max_grace_s)
            if g > 0:
                out[v.by] = max(out.get(v.by, 0.0), g)
    return out


def stop_now(s: Session, v: Victim, *, actor: str, now: float) -> None:
    """RUNNING|SCHEDULED -> PREEMPTED -> PENDING at once; its nodes are told to stop."""
    vals = release_attempt(s, v.job, now=now, confirmed=False)
    vals |= {"ended_at": None, "pending_since": now, "scheduled_at": None, "started_at": None}
    move(
        s,
        v.jref,
        JobState.PENDING,
        via=JobState.PREEMPTED,
        actor=actor,
        reason=v.reason,
        now=now,
        values=vals,
    )


def begin_grace(s: Session, v: Victim, *, until: float, actor: str, now: float) -> None:
    """Keep the RUNNING victim until ``until``: recorded with an event; its agents are
    woken so that the signal goes out now."""
    asked = f"--signal={v.job.signal}" if v.job.signal else "no signal asked"
    why = f"{v.reason}; stops at {until:.0f} ({until - now:g}s grace, {asked})"
    values = {"preempt_at": until, "preempt_by": int(v.by), "preempt_reason": v.reason[:512]}
    move(s, v.jref, JobState.RUNNING, actor=actor, reason=why, now=now, values=values)
    touch(s, set(s.scalars(select(Allocation.node).where(Allocation.job_id == v.job.id))))


def end_graces(s: Session, now: float, *, actor: str) -> int:
    """RUNNING jobs whose grace is over: preempted now (how many)."""
    q = select(Job).where(
        Job.state == str(JobState.RUNNING), Job.preempt_at.is_not(None), Job.preempt_at <= now
    )
    n = 0
    for job in s.scalars(q):
        why = f"{job.preempt_reason or 'preempted'}; its grace is over"
        stop_now(s, Victim(job=job, jref=ref(job), by=str(job.preempt_by), reason=why), actor=actor, now=now)
        n += 1
    return n


def exited_in_grace(
    s: Session,
    job: Job,
    *,
    node: str,
    exit_code: int | None,
    actor: str,
    now: float,
    readings: ledger.Readings = ledger.no_readings,
) -> bool:
    """A victim that exited during its grace (on ``node``) is preempted, not ended:
    True when it was one (and is now PENDING)."""
    if job.preempt_at is None or job.state != JobState.RUNNING:
        return False
    vals = release_attempt(s, job, now=now, confirmed=False, confirmed_on=node, readings=readings)
    vals |= {"ended_at": None, "pending_since": now, "scheduled_at": None, "started_at": None}
    why = f"{job.preempt_reason or 'preempted'}; exited with code {exit_code} on {node} during its grace"
    move(s, ref(job), JobState.PENDING, via=JobState.PREEMPTED, actor=actor, reason=why, now=now, values=vals)
    return True
