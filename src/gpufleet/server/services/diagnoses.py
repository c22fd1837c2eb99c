"""Failure diagnosis from job output (issue 34): which failed attempts to read, what
their output matched, and the node suspicion it raises.

**Where it runs, and why the server.** A job's output is its owner's, hostile bytes.
The agent already ships it through its one bounded reader (``agent/logship.py``: the
attempt's ``output.log``, a file the agent itself created 0600 in its own work dir,
never a path the user names), and the server stores it as text (``services/logs.py``).
Reading it a second time on the node, as root, would add a second reader of user bytes
for nothing; matching on the server instead keeps the operator's signature table in
one place (``gpufleet server --diagnosis-rules``: no rules to ship to the agents or to
keep in step), and ties each finding to the node that shipped the stream (its
credential; ``nodework.scope_of`` already checked that the node ran that attempt). The
cost: a log past the server's per-stream cap (``--job-log-max-mib``, 64 MiB) has its
tail dropped, so such a job is not diagnosed.

**When.** A node's sync that closes an attempt's log (the chunk marked ``last``) of a
job that is FAILED (it exited non-zero or on a signal) queues one ``job_diagnoses``
row (``queue_closed``, inside the sync's transaction: one small insert). The matching
itself never runs in the sync (the group commit is shared by every agent): the
diagnosis loop (``loops/diagnosis.py``) takes queued rows one by one (``diagnose_queued``):
reads the last 64 KiB of that stream (a read transaction), matches it with no
transaction open (``gpufleet.diagnosis.diagnose``: bounded per line and in time), and
writes what it found in one short transaction: the row; the job's ``diagnosis`` when
it is the job's first finding or outranks it (several nodes of one job: the highest
priority wins), with a job event; and, for a signature that blames the node, a
``suspect`` fleet event and the suspicion rule (``decide/suspicion.py``), which may
cordon the node with its evidence (a ``cordoned`` fleet event, critical). An operator
uncordons it as any cordon (``gpufleet node uncordon``).
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from gpufleet.api.nodes import LogChunkIn
from gpufleet.diagnosis import TAIL_CHARS, Finding, diagnose
from gpufleet.server.decide.suspicion import DiagnosisConfig, Evidence, judge
from gpufleet.server.jobstate.states import JobState
from gpufleet.server.jobstate.transitions import attempt_of
from gpufleet.server.services.nodeops import add_event
from gpufleet.server.store import effects
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import Job, JobDiagnosis, JobEvent, JobLogChunk, NodeRow

log = logging.getLogger("gpufleet.server")
ACTOR = "diagnosis"


# -- in a node's sync --------------------------------------------------------------------------------


def queue_closed(s: Session, node: str, chunks: list[LogChunkIn], now: float) -> int:
    """Queue the attempts whose log this sync closed, of jobs now FAILED at that attempt
    (run after the sync's observations and logs are applied); returns how many."""
    closed = {(c.job_id, c.attempt) for c in chunks if c.last}
    if not closed:
        return 0
    rows = s.execute(
        select(Job.id, Job.state, Job.scheduled_at, Job.user_id).where(Job.id.in_({j for j, _ in closed}))
    ).all()
    failed = {
        (r.id, attempt_of(r.scheduled_at)): r.user_id
        for r in rows
        if r.state == JobState.FAILED and (r.id, attempt_of(r.scheduled_at)) in closed
    }
    if not failed:
        return 0
    have = set(
        s.execute(
            select(JobDiagnosis.job_id, JobDiagnosis.attempt).where(
                JobDiagnosis.node == node, JobDiagnosis.job_id.in_({j for j, _ in failed})
            )
        ).tuples()
    )
    new = [k for k in sorted(failed) if k not in have]
    if new:
        effects.wake_diagnosis(s)  # the diagnosis loop at rest (``loops/diagnosis.py``)
    for job_id, attempt in new:
        s.add(
            JobDiagnosis(
                job_id=job_id, attempt=attempt, node=node, user_id=failed[(job_id, attempt)], queued_at=now
            )
        )
    return len(new)


# -- the loop's work -------------------------------------------------------------------------------


def queued(db: Database, *, limit: int = 50) -> list[int]:
    """The ids of queued rows, oldest first."""
    with db.read() as s:
        q = select(JobDiagnosis.id).where(JobDiagnosis.done_at.is_(None)).order_by(JobDiagnosis.id)
        return list(s.scalars(q.limit(limit)))


def tail_of(s: Session, job_id: int, attempt: int, node: str, *, chars: int = TAIL_CHARS) -> str:
    """The last ``chars`` characters one node shipped of one attempt's log."""
    q = (
        select(JobLogChunk.data)
        .where(
            JobLogChunk.job_id == job_id,
            JobLogChunk.attempt == attempt,
            JobLogChunk.node == node,
            JobLogChunk.offset >= 0,
        )
        .order_by(JobLogChunk.offset.desc())
    )
    parts: list[str] = []
    got = 0
    for data in s.scalars(q.execution_options(yield_per=8)):
        parts.append(data)
        got += len(data)
        if got >= chars:
            break
    return "".join(reversed(parts))[-chars:]


def diagnose_one(db: Database, item: int, *, config: DiagnosisConfig, now: float) -> Finding | None:
    """Read, match and record one queued row (nothing if it is gone or done)."""
    with db.read() as s:
        row = s.get(JobDiagnosis, item)
        if row is None or row.done_at is not None:
            return None
        job_id, attempt, node, user_id = row.job_id, row.attempt, row.node, row.user_id
        text = tail_of(s, job_id, attempt, node)
    verdict = diagnose(text, config.signatures, budget_s=config.budget_s)
    found = verdict.finding
    if verdict.exhausted:
        log.warning(
            "diagnosis of job %s on %s: stopped after %s lines (time budget)", job_id, node, verdict.lines
        )
    with db.write() as s:
        result = s.execute(
            update(JobDiagnosis)
            .where(JobDiagnosis.id == item, JobDiagnosis.done_at.is_(None))
            .values(
                done_at=now,
                signature=None if found is None else found.signature,
                blame=None if found is None else found.blame,
                line=None if found is None else found.line[:512],
            )
        )
        done = int(getattr(result, "rowcount", 0) or 0)
        if done != 1 or found is None:
            return None
        _attach(s, job_id, node, found, now)
        if found.blame == "node":
            _suspect(s, node=node, job_id=job_id, user_id=user_id, found=found, config=config, now=now)
    return found


def diagnose_queued(db: Database, *, config: DiagnosisConfig, now: float, limit: int = 50) -> int:
    """Diagnose up to ``limit`` queued rows, one transaction each; a row that fails is
    logged and counted as done with nothing found (never retried for ever); returns how
    many were handled."""
    handled = 0
    for item in queued(db, limit=limit):
        try:
            diagnose_one(db, item, config=config, now=now)
        except Exception:  # one bad item never stops the loop
            log.exception("diagnosis of queued row %s failed; marked done", item)
            with db.write() as s:
                s.execute(
                    update(JobDiagnosis)
                    .where(JobDiagnosis.id == item, JobDiagnosis.done_at.is_(None))
                    .values(done_at=now)
                )
        handled += 1
    return handled


# -- what a finding changes --------------------------------------------------------------------------


def as_json(found: Finding, *, node: str, at: float) -> dict[str, Any]:
    """``api.jobs.JobDiagnosis`` as stored in ``Job.diagnosis``."""
    return {
        "signature": found.signature,
        "diagnosis": found.diagnosis,
        "hint": found.hint,
        "blame": found.blame,
        "priority": found.priority,
        "node": node,
        "line": found.line,
        "at": at,
    }


def _attach(s: Session, job_id: int, node: str, found: Finding, now: float) -> None:
    """The job's diagnosis, unless it has one that ranks as high (a plain column: no
    version bump, the scheduling pass never reads it)."""
    job = s.execute(select(Job.state, Job.diagnosis).where(Job.id == job_id)).first()
    if job is None:
        return
    old = job.diagnosis or {}
    if old and int(old.get("priority", 0)) >= found.priority:
        return
    s.execute(update(Job).where(Job.id == job_id).values(diagnosis=as_json(found, node=node, at=now)))
    s.add(
        JobEvent(
            job_id=job_id,
            at=now,
            actor=ACTOR,
            from_state=job.state,
            to_state=job.state,
            reason=f"diagnosed on {node}: {found.signature}: {found.diagnosis}"[:512],
        )
    )


def _suspect(
    s: Session, *, node: str, job_id: int, user_id: int, found: Finding, config: DiagnosisConfig, now: float
) -> None:
    rule = config.suspicion
    rows = s.execute(
        select(JobDiagnosis.id, JobDiagnosis.job_id, JobDiagnosis.user_id, JobDiagnosis.done_at).where(
            JobDiagnosis.node == node,
            JobDiagnosis.signature == found.signature,
            JobDiagnosis.blame == "node",
            JobDiagnosis.spent.is_(False),
            JobDiagnosis.done_at >= now - rule.window_s,
        )
    ).all()
    evidence = [Evidence(job_id=r.job_id, user_id=r.user_id, at=r.done_at or now) for r in rows]
    seen = judge(evidence, rule, now)
    of = f"{seen.users} of {rule.users}" if rule.users else f"{seen.users}"
    add_event(
        s,
        at=now,
        node=node,
        kind="suspect",
        severity="warning",
        actor=ACTOR,
        job_id=job_id,
        reason=f"job {job_id} failed with {found.signature} ({found.diagnosis}); users so far: {of} "
        f"within {rule.window_s / 3600:g} h",
    )
    if not seen.cordon:
        return
    row = s.get(NodeRow, node)
    if row is None or row.cordoned:  # already out of service: its cordon and reason stay
        return
    jobs = ", ".join(map(str, seen.jobs[-10:]))
    row.cordoned, row.cordon_reason = True, f"suspect: {found.signature} in failed jobs {jobs}"[:256]
    add_event(
        s,
        at=now,
        node=node,
        kind="cordoned",
        severity="critical",
        actor=ACTOR,
        job_id=job_id,
        reason=f"{found.signature} ({found.diagnosis}) in failed jobs of {seen.users} users within "
        f"{rule.window_s / 3600:g} h: jobs {jobs}; last line: {found.line}; uncordon it once repaired",
    )
    s.execute(update(JobDiagnosis).where(JobDiagnosis.id.in_([r.id for r in rows])).values(spent=True))
    effects.invalidate_fleets(s)
    log.warning("node %s cordoned by diagnosis: %s in jobs %s", node, found.signature, jobs)


# -- retention ---------------------------------------------------------------------------------------


def purge(db: Database, *, before: float, chunk: int = 5000) -> int:
    """Delete diagnoses done before ``before``, ``chunk`` at a time (the retention loop,
    with the logs they read: ``--log-days``); returns how many went. Queued rows stay, and
    so does each job's finding (``Job.diagnosis``): only the work items and the evidence
    that ``decide/suspicion.py`` no longer counts (its window is a day) go."""
    gone = 0
    while True:
        with db.write() as s:
            ids = list(
                s.scalars(
                    select(JobDiagnosis.id)
                    .where(JobDiagnosis.done_at < before)
                    .order_by(JobDiagnosis.id)
                    .limit(chunk)
                )
            )
            if ids:
                s.execute(delete(JobDiagnosis).where(JobDiagnosis.id.in_(ids)))
        gone += len(ids)
        if len(ids) < chunk:
            return gone
