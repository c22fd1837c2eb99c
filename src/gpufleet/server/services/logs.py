"""Job logs as shipped by the agents (``job_logs`` rows): storing a node's chunks
(``ingest_logs``, inside its sync's transaction), reading them (``read_logs``) and
deleting old ones (``purge``, the log-retention loop).

A job's log is its chunks in arrival order, over all its attempts and nodes. Each
(job, attempt, node) is a stream of byte offsets in the node's log file: a chunk is
stored only if it starts where the stream ends (a resent chunk is never stored twice).

Bounds (issue 29): an agent reports a job's exit at once and ships the rest of its log
afterwards. A chunk marked ``more`` (the attempt is over, more of its log follows) opens
the stream: an empty row at offset -1 says so, and while it is there the server takes
the rest from that node though the node no longer holds the job (for the job's latest
attempt only); the chunk marked ``last`` deletes it. An agent that ships the whole log
before it reports the exit never opens one. Past ``max_bytes`` of a stream (64 MiB, the
server's ``--job-log-max``) nothing more is stored: one row holds a marker line, its
``end`` advanced by every chunk dropped after it (what ``end - offset`` of that row
counts). ``purge`` deletes the logs of jobs that ended more than the retention ago.

Reading follows job visibility: a plain user reads only their own jobs' logs (another
user's job is a 404, as everywhere); operators and admins read all. A log is finished
(``gpufleet logs -f`` ends) once the job is over, every node confirmed it stopped, and
no stream of its last attempt is still open (or ``TAIL_S`` passed since it ended: a node
that died with its log unshipped does not hold a follower for ever).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, case, delete, func, insert, select, update
from sqlalchemy.orm import Session

from gpufleet.api.nodes import LogAck, LogChunkIn
from gpufleet.server.jobstate.states import TERMINAL, JobState
from gpufleet.server.jobstate.transitions import attempt_of
from gpufleet.server.problems import Failure, not_found
from gpufleet.server.services.auth import Principal
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import Job, JobLogChunk, JobStep, JobStepOutput

MIB = 1024 * 1024
LOG_MAX_BYTES = 64 * MIB
TAIL_S = 600.0
"""How long after its end a job's log may still be completed by its nodes (the agent's
``log_tail_s`` is the same)."""
Key = tuple[int, int]


def cap_marker(limit: int) -> str:
    return f"\ngpufleet: this job's log reached the server's cap of {limit} bytes: the rest is not kept\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class LogPage:
    chunks: tuple[str, ...]
    last_id: int
    """Pass as ``after`` to read on."""
    finished: bool
    """The job is over, every node confirmed it stopped and sent the rest of its log:
    no more output will come."""


OPEN = -1
"""The ``offset`` (and ``end``) of the row that holds a stream open."""


def _open_streams(s: Session, job_id: int, attempt: int) -> bool:
    q = select(JobLogChunk.id).where(
        JobLogChunk.job_id == job_id, JobLogChunk.attempt == attempt, JobLogChunk.offset == OPEN
    )
    return s.execute(q.limit(1)).first() is not None


def read_logs(
    *,
    db: Database,
    actor: Principal,
    job_id: int,
    after: int = 0,
    limit: int = 500,
    now: float | None = None,
) -> LogPage | Failure:
    now = time.time() if now is None else now
    with db.read() as s:
        job = s.execute(
            select(Job.user_id, Job.state, Job.stopping_on, Job.scheduled_at, Job.ended_at).where(
                Job.id == job_id
            )
        ).first()
        if job is None or (not actor.is_operator and job.user_id != actor.user_id):
            return not_found(f"no job {job_id}")
        q = (
            select(JobLogChunk.id, JobLogChunk.data)
            .where(JobLogChunk.job_id == job_id, JobLogChunk.id > after)
            .order_by(JobLogChunk.id)
            .limit(limit)
        )
        rows = s.execute(q).all()
        finished = JobState(job.state) in TERMINAL and job.stopping_on is None
        if finished and (job.ended_at is None or now - job.ended_at < TAIL_S):
            finished = not _open_streams(s, job_id, attempt_of(job.scheduled_at))
    return LogPage(
        chunks=tuple(d for _, d in rows if d),
        last_id=rows[-1][0] if rows else after,
        finished=finished,
    )


# -- a node's chunks -------------------------------------------------------------------------------


def open_tails(s: Session, node: str, jobs: dict[int, Job], keys: Iterable[Key]) -> set[Key]:
    """Of ``keys``, the attempts whose log this node may still complete though it no longer
    holds them: the job's latest attempt, its stream from this node open."""
    latest = {(j, a) for j, a in keys if j in jobs and a == attempt_of(jobs[j].scheduled_at)}
    if not latest:
        return set()
    q = select(JobLogChunk.job_id, JobLogChunk.attempt).where(
        JobLogChunk.node == node, JobLogChunk.job_id.in_({j for j, _ in latest}), JobLogChunk.offset == OPEN
    )
    return {(j, a) for j, a in s.execute(q) if (j, a) in latest}


@dataclass(slots=True)
class _Stream:
    end: int
    open: bool
    marker: int | None = None
    """The id of the server cap's marker row once it is stored (its ``end`` moves on)."""


def _where(node: str, key: Key) -> tuple[ColumnElement[bool], ...]:
    return (JobLogChunk.job_id == key[0], JobLogChunk.attempt == key[1], JobLogChunk.node == node)


def _stream(s: Session, node: str, key: Key) -> _Stream:
    where = _where(node, key)
    is_open = func.max(case((JobLogChunk.offset == OPEN, 1), else_=0))
    end, opened = s.execute(select(func.coalesce(func.max(JobLogChunk.end), 0), is_open).where(*where)).one()
    return _Stream(end=int(end or 0), open=bool(opened))


def _drop(s: Session, node: str, key: Key, st: _Stream, c: LogChunkIn, max_bytes: int, now: float) -> None:
    """A chunk past the cap: the marker row once, then only its ``end`` moves on."""
    if st.marker is None:
        last = s.execute(
            select(JobLogChunk.id, JobLogChunk.data)
            .where(JobLogChunk.job_id == key[0], JobLogChunk.attempt == key[1], JobLogChunk.node == node)
            .order_by(JobLogChunk.end.desc())
            .limit(1)
        ).first()
        if last is not None and last.data == cap_marker(max_bytes):
            st.marker = last.id
    if st.marker is None:
        row = {"job_id": key[0], "attempt": key[1], "node": node, "offset": c.offset, "end": c.end}
        st.marker = s.scalar(
            insert(JobLogChunk).values(**row, data=cap_marker(max_bytes), at=now).returning(JobLogChunk.id)
        )
    else:
        s.execute(update(JobLogChunk).where(JobLogChunk.id == st.marker).values(end=c.end))


def ingest_logs(
    s: Session, node: str, chunks: Sequence[LogChunkIn], now: float, *, max_bytes: int = LOG_MAX_BYTES
) -> list[LogAck]:
    """Store the chunks (the node may ship all of them: ``scope_of``); the acks say
    where each stream now ends."""
    streams: dict[Key, _Stream] = {}
    for c in chunks:
        key = (c.job_id, c.attempt)
        st = streams.get(key) or streams.setdefault(key, _stream(s, node, key))
        if c.offset != st.end or c.end < c.offset:
            continue
        row = {"job_id": c.job_id, "attempt": c.attempt, "node": node, "offset": c.offset, "end": c.end}
        if c.end > c.offset and c.end > max_bytes and (c.offset >= max_bytes or st.marker is not None):
            _drop(s, node, key, st, c, max_bytes, now)
        elif c.end > c.offset:  # data cleaned of NULs by its schema (``LogChunkIn``)
            s.execute(insert(JobLogChunk).values(**row, data=c.data, at=now))
        st.end = c.end
        if c.more and not c.last and not st.open:
            s.execute(insert(JobLogChunk).values(**{**row, "offset": OPEN, "end": OPEN}, data="", at=now))
            st.open = True
        if c.last and st.open:
            s.execute(delete(JobLogChunk).where(*_where(node, key), JobLogChunk.offset == OPEN))
            st.open = False
    return [LogAck(job_id=j, attempt=a, end=st.end) for (j, a), st in sorted(streams.items())]


def purge(db: Database, *, before: float, batch: int = 20) -> int:
    """Delete the logs of jobs that ended before ``before`` (in batches of jobs: one
    transaction never holds a long lock); returns how many jobs' logs went. A job's log
    is its chunks and the output its steps' tasks sent (``srun`` follows that; the same
    lines are in the job's own log through srun's stdout): both go. The job and its
    steps' records stay."""
    gone = 0
    stepped = select(JobStep.id).where(JobStep.id.in_(select(JobStepOutput.step_id).distinct()))
    while True:
        with db.write() as s:
            ids = list(
                s.scalars(
                    select(Job.id)
                    .where(Job.ended_at < before, Job.id.in_(select(JobLogChunk.job_id).distinct()))
                    .limit(batch)
                )
            )
            steps = list(
                s.scalars(
                    stepped.join(Job, Job.id == JobStep.job_id).where(Job.ended_at < before).limit(batch * 8)
                )
            )
            if not ids and not steps:
                return gone
            if ids:
                s.execute(delete(JobLogChunk).where(JobLogChunk.job_id.in_(ids)))
            if steps:
                s.execute(delete(JobStepOutput).where(JobStepOutput.step_id.in_(steps)))
            gone += len(ids)
