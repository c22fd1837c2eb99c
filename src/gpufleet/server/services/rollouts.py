"""What the replica controller and ``service show`` observe of a service's current
generation besides its replicas: when it began, how its replicas ended, and why the last
one did. ``replicas.rollout_status`` turns that into a verdict; the controller's crash
back-off (``crash_backoff``) reads the same exits, per slot.

An exit is a replica job of the service that ended (COMPLETED, FAILED, TIMEOUT): a
replica is meant to run until it is stopped, so any end the controller did not ask for
counts. Replicas the controller stopped (CANCELLED) do not. Only jobs submitted since
the service row was created count: a name deployed again after a delete never inherits
the old service's exits (SQLite may even hand out the old row's id again).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet.server.decide.replicas import Progress, Replica, Rollout, Wish, rollout_status
from gpufleet.server.jobstate.states import JobState
from gpufleet.server.store.models import Job, JobLogChunk, ServiceEvent, ServiceRow

EXITED = (str(JobState.COMPLETED), str(JobState.FAILED), str(JobState.TIMEOUT))
CRASH_WINDOW_S = 600.0
"""Exits older than this no longer lengthen a slot's back-off (Kubernetes resets a
container's back-off after 10 minutes of running fine)."""
BACKOFF_FIRST_S = 5.0
BACKOFF_MAX_S = 300.0
LINE_CHARS = 200
LINE_LOOKS = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class Exit:
    job_id: int
    slot: int
    code: int | None
    state: str
    ended_at: float
    line: str | None
    """The last line of its output (where its agent shipped it): what it said last."""

    def describe(self) -> str:
        code = f"exit code {self.code}" if self.code is not None else self.state.lower()
        said = f": {self.line}" if self.line else ""
        return f"job {self.job_id} (slot {self.slot}) {code}{said}"


def generation_since(s: Session, row: ServiceRow) -> float:
    """When the current generation began: its ``updated`` event, else the deploy."""
    if row.generation <= 1:
        return row.created_at
    at = s.scalar(
        select(func.max(ServiceEvent.at)).where(
            ServiceEvent.service_id == row.id, ServiceEvent.kind == "updated"
        )
    )
    return float(at) if at is not None else row.created_at


def last_line(s: Session, job_id: int) -> str | None:
    """The last non-empty line of a job's shipped output, cut to ``LINE_CHARS``."""
    data = s.scalar(
        select(JobLogChunk.data).where(JobLogChunk.job_id == job_id).order_by(JobLogChunk.id.desc()).limit(1)
    )
    if not data:
        return None
    lines = [ln.strip() for ln in str(data)[-4096:].splitlines() if ln.strip()]
    if not lines:
        return None
    line = "".join(ch if ch.isprintable() else "?" for ch in lines[-1])
    return line[:LINE_CHARS]


def exits(
    s: Session, row: ServiceRow, *, since: float, generation: int | None = None, slot: int | None = None
) -> list[Exit]:
    """The service's replica exits since ``since`` (newest first), of one generation or
    one slot when given. The newest exits carry their last line: the first of the
    newest few that has one (an exit is reported before its log has all been shipped)."""
    q = select(Job.id, Job.replica, Job.exit_code, Job.state, Job.ended_at).where(
        Job.service_id == row.id,
        Job.state.in_(EXITED),
        Job.submit_time >= row.created_at,
        Job.ended_at >= since,
    )
    if generation is not None:
        q = q.where(Job.generation == generation)
    if slot is not None:
        q = q.where(Job.replica == slot)
    rows = s.execute(q.order_by(Job.ended_at.desc(), Job.id.desc())).all()
    out = [
        Exit(job_id=jid, slot=rep or 0, code=code, state=state, ended_at=ended or 0.0, line=None)
        for jid, rep, code, state, ended in rows
    ]
    for i, e in enumerate(out[:LINE_LOOKS]):
        line = last_line(s, e.job_id)
        if line is not None:
            out[i] = replace(e, line=line)
            break
    return out


def last_words(seen: list[Exit]) -> str | None:
    """How the newest exit that said something ended (else the newest exit)."""
    for e in seen[:LINE_LOOKS]:
        if e.line is not None:
            return e.describe()
    return seen[0].describe() if seen else None


def progress(s: Session, row: ServiceRow) -> Progress:
    since = generation_since(s, row)
    seen = exits(s, row, since=since, generation=row.generation)
    return Progress(since=since, exits=len(seen), last_exit=last_words(seen))


def crash_backoff(s: Session, row: ServiceRow, slot: int, now: float) -> tuple[float | None, str | None]:
    """When a new replica in ``slot`` may start, and why it waits: Kubernetes'
    CrashLoopBackOff per container: the first restart at once, then 5 s doubling to
    5 min, counting the slot's exits of the last ``CRASH_WINDOW_S``. (None, None): now."""
    seen = exits(s, row, since=now - CRASH_WINDOW_S, slot=slot)
    if len(seen) < 2:
        return None, None
    wait = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2.0 ** min(len(seen) - 2, 10))
    reason = (
        f"CrashLoopBackOff: slot {slot} exited {len(seen)} times in {CRASH_WINDOW_S:g}s; "
        f"restarts {wait:g}s after the last exit; last: {last_words(seen)}"
    )
    until = seen[0].ended_at + wait
    return (until, reason) if until > now else (None, None)


def stall_said(s: Session, row: ServiceRow, since: float) -> str | None:
    """The reason of the ``stalled`` event of the generation that began at ``since``."""
    return s.scalar(
        select(ServiceEvent.reason)
        .where(ServiceEvent.service_id == row.id, ServiceEvent.kind == "stalled", ServiceEvent.at >= since)
        .order_by(ServiceEvent.id)
        .limit(1)
    )


def shown(s: Session, row: ServiceRow, wish: Wish, replicas: list[Replica]) -> Rollout:
    """The rollout as ``service show`` tells it: complete from the replicas; stalled
    once the controller said so for this generation (it holds the clock: its ``stalled``
    event), with the reason as it stands now (the last exit's line may have been shipped
    since); else progressing."""
    verdict = rollout_status(wish, replicas, Progress(since=float("inf")), 0.0)
    if verdict.state == "complete":
        return verdict
    since = generation_since(s, row)
    if stall_said(s, row, since) is None:
        return verdict
    return rollout_status(wish, replicas, progress(s, row), float("inf"))


def note_stall(s: Session, row: ServiceRow, wish: Wish, replicas: list[Replica], *, now: float) -> str | None:
    """The controller's part: the reason when this generation's rollout has just become
    stalled (the caller writes the event), else None. Asks the database only while the
    rollout is not complete."""
    if rollout_status(wish, replicas, Progress(since=now), now).state == "complete":
        return None
    seen = progress(s, row)
    verdict = rollout_status(wish, replicas, seen, now)
    if verdict.state != "stalled" or stall_said(s, row, seen.since) is not None:
        return None
    return verdict.reason
