from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gpufleet.server.deps import Me, PartsDep
from gpufleet.server.problems import ProblemError, unwrap
from gpufleet.server.schemas import JobDetail, JobPage, JobSubmit, PriorityChange
from gpufleet.server.services import jobs
from gpufleet.server.states import JobState

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.post("", status_code=201, response_model=JobDetail)
async def submit(spec: JobSubmit, parts: PartsDep, me: Me) -> JobDetail:
    """Async (the only async handler here): it waits on the group commit, not in a
    thread of the pool, so a submit costs no thread hand-off."""
    return unwrap(
        await jobs.submit(
            writer=parts.writer,
            actor=me,
            spec=spec,
            now=parts.now(),
            fleets=parts.fleets,
            waker=parts.scheduler.wake,
        )
    )


def _states(raw: list[str]) -> list[JobState]:
    names = [x.strip().upper() for r in raw for x in r.split(",") if x.strip()]
    bad = [n for n in names if n not in JobState.__members__]
    if bad:
        raise ProblemError(422, f"state: unknown state {', '.join(bad)}; one of {', '.join(JobState)}")
    return [JobState(n) for n in names]


@router.get("", response_model=JobPage)
def list_jobs(
    parts: PartsDep,
    me: Me,
    state: Annotated[list[str], Query(description="repeat or comma-separate")] = [],  # noqa: B006
    user: str | None = None,
    team: str | None = None,
    pool: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[int | None, Query(ge=0)] = None,
    offset: Annotated[int | None, Query(ge=0)] = None,
) -> JobPage:
    return jobs.list_jobs(
        db=parts.db,
        actor=me,
        states=_states(state),
        user=user,
        team=team,
        pool=pool,
        limit=limit,
        cursor=cursor,
        offset=offset,
    )


@router.get("/{job_id}", response_model=JobDetail)
def show(job_id: int, parts: PartsDep, me: Me) -> JobDetail:
    return unwrap(jobs.show(db=parts.db, actor=me, job_id=job_id))


@router.post("/{job_id}/cancel", response_model=JobDetail)
def cancel(job_id: int, parts: PartsDep, me: Me) -> JobDetail:
    return unwrap(
        jobs.cancel(db=parts.db, actor=me, job_id=job_id, now=parts.now(), waker=parts.scheduler.wake)
    )


@router.post("/{job_id}/hold", response_model=JobDetail)
def hold(job_id: int, parts: PartsDep, me: Me) -> JobDetail:
    return unwrap(jobs.hold(db=parts.db, actor=me, job_id=job_id, now=parts.now()))


@router.post("/{job_id}/release", response_model=JobDetail)
def release(job_id: int, parts: PartsDep, me: Me) -> JobDetail:
    return unwrap(
        jobs.release(db=parts.db, actor=me, job_id=job_id, now=parts.now(), waker=parts.scheduler.wake)
    )


@router.put("/{job_id}/priority", response_model=JobDetail)
def set_priority(job_id: int, body: PriorityChange, parts: PartsDep, me: Me) -> JobDetail:
    return unwrap(
        jobs.set_priority(
            db=parts.db,
            actor=me,
            job_id=job_id,
            priority=body.priority,
            now=parts.now(),
            waker=parts.scheduler.wake,
        )
    )
