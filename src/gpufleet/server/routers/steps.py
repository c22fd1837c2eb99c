"""Job steps (``srun`` inside an allocation): create, follow, list, cancel
(``services/steps.py`` has the rules)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gpufleet.api.base import INT32
from gpufleet.api.steps import StepIn, StepList, StepOut
from gpufleet.server.http.deps import Me, PartsDep
from gpufleet.server.problems import ObjectId, StepNumber, not_found, unwrap
from gpufleet.server.services import steps

router = APIRouter(prefix="/jobs", tags=["jobs"])
bulk = APIRouter(tags=["jobs"])


@bulk.get("/steps", response_model=StepList)
def of_jobs(
    parts: PartsDep,
    me: Me,
    job: Annotated[list[int], Query(max_length=1000, description="job ids (repeat the parameter)")],
) -> StepList:
    """The steps of these jobs (yours; every job's for operators): ``gpufleet history``."""
    return steps.steps_of_jobs(db=parts.db, actor=me, job_ids=[j for j in job if 1 <= j <= INT32])


@router.post("/{job_id}/steps", response_model=StepOut, status_code=201)
def create(job_id: ObjectId, body: StepIn, parts: PartsDep, me: Me) -> StepOut:
    """``srun`` inside the job: a step of tasks over the job's nodes (409 unless it runs)."""
    return unwrap(steps.create_step(db=parts.db, actor=me, job_id=job_id, spec=body, now=parts.now()))


@router.get("/{job_id}/steps", response_model=StepList)
def list_all(job_id: ObjectId, parts: PartsDep, me: Me) -> StepList:
    return unwrap(steps.list_steps(db=parts.db, actor=me, job_id=job_id))


@router.get("/{job_id}/steps/{step}", response_model=StepOut)
def show(
    job_id: ObjectId,
    step: StepNumber,
    parts: PartsDep,
    me: Me,
    after: Annotated[
        int | None, Query(ge=0, le=2**63 - 1, description="also the output stored after this piece id")
    ] = None,
) -> StepOut:
    if not 0 <= step <= INT32:
        return unwrap(not_found(f"no step {job_id}.{step}"))
    return unwrap(steps.show_step(db=parts.db, actor=me, job_id=job_id, step=step, after=after))


@router.post("/{job_id}/steps/{step}/cancel", response_model=StepOut)
def cancel(job_id: ObjectId, step: StepNumber, parts: PartsDep, me: Me) -> StepOut:
    if not 0 <= step <= INT32:
        return unwrap(not_found(f"no step {job_id}.{step}"))
    return unwrap(steps.cancel_step(db=parts.db, actor=me, job_id=job_id, step=step, now=parts.now()))
