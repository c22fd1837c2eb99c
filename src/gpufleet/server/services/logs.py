"""Job logs as shipped by the agents (``job_logs`` rows, see ``services/sync.py``).

Reading follows job visibility: a plain user reads only their own jobs' logs (another
user's job is a 404, as everywhere); operators and admins read all. A job's log is its
chunks in arrival order, over all its attempts and nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from gpufleet.server.db import Database
from gpufleet.server.jobstate.states import TERMINAL, JobState
from gpufleet.server.models import Job, JobLogChunk
from gpufleet.server.problems import Failure, not_found
from gpufleet.server.services.auth import Principal


@dataclass(frozen=True, slots=True, kw_only=True)
class LogPage:
    chunks: tuple[str, ...]
    last_id: int
    """Pass as ``after`` to read on."""
    finished: bool
    """The job is over and every node confirmed it stopped: no more output will come."""


def read_logs(
    *, db: Database, actor: Principal, job_id: int, after: int = 0, limit: int = 500
) -> LogPage | Failure:
    with db.read() as s:
        row = s.execute(select(Job.user_id, Job.state, Job.stopping_on).where(Job.id == job_id)).first()
        if row is None or (not actor.is_operator and row.user_id != actor.user_id):
            return not_found(f"no job {job_id}")
        q = (
            select(JobLogChunk.id, JobLogChunk.data)
            .where(JobLogChunk.job_id == job_id, JobLogChunk.id > after)
            .order_by(JobLogChunk.id)
            .limit(limit)
        )
        rows = s.execute(q).all()
    return LogPage(
        chunks=tuple(d for _, d in rows),
        last_id=rows[-1][0] if rows else after,
        finished=JobState(row.state) in TERMINAL and row.stopping_on is None,
    )
