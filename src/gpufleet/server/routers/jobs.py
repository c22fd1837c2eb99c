"""Jobs: submit, list, show, cancel, hold, release, priority, requeue, update.

Every submission is served by ``submit``'s route, ``SubmitRoute``, which solves that one
endpoint's parameters itself (FastAPI's way, without FastAPI's generic request handler);
``SubmitShortcut`` hands it ``POST /v1/jobs`` without FastAPI's route matching. The
other routes are plain FastAPI."""

from __future__ import annotations

import email.message
import json
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from gpufleet.api.base import INT32
from gpufleet.api.bulk import JobMatch, JobsChanged, JobsUpdate
from gpufleet.api.jobs import Cancelled, CancelMany, JobDetail, JobPage, JobSubmit, JobUpdate, PriorityChange
from gpufleet.server.http.audit import note_object
from gpufleet.server.http.deps import Me, Parts, PartsDep, current_principal, get_parts
from gpufleet.server.jobstate.states import JobState
from gpufleet.server.problems import IdQuery, ObjectId, ProblemError, answered, unwrap
from gpufleet.server.services import bulkjobs, jobs, submissions
from gpufleet.server.services.auth import Principal

router = APIRouter(prefix="/jobs", tags=["jobs"])


async def submit(request: Request, spec: JobSubmit, parts: PartsDep, me: Me) -> Response:
    """Async (the only async handler here): it waits on the group commit, not in a
    thread of the pool, so a submit costs no thread hand-off. The reply is serialised
    here, once: the service built it from validated values, so FastAPI's validation of
    the returned model against ``response_model`` would only repeat work."""
    # That docstring is the operation's description in the OpenAPI document, which this
    # signature declares; ``SubmitRoute`` solves it.
    out = unwrap(
        await submissions.submit(
            writer=parts.writer,
            actor=me,
            spec=spec,
            now=parts.now(),
            fleets=parts.fleets,
            budget_warning=parts.budget_warnings.get,
            pending=parts.pending,
        )
    )
    note_object(request.scope, out.id)  # for the audit log, which need not parse the reply
    return Response(out.model_dump_json(), status_code=201, media_type="application/json")


class SubmitRoute(APIRoute):
    """The route of ``submit`` (``POST /v1/jobs``: every submission, the API's hot path).
    It serves the endpoint without FastAPI's generic request handler, whose dependency
    solving and body-field validation cost about 0.2 ms of CPU a submission (measured in
    process), a third of all the rest a submission costs the API process (``API ms/job``
    in ``bench/bench_api.py``: about 0.6 ms).
    ``_solve`` does what that handler would for ``submit``'s signature, in its order and
    with its errors: read the body; parse it when its Content-Type says JSON (400; the
    body limit's 413); the caller, by the ``Me`` dependency's own function
    (``current_principal``: 401, a token the cache lacks looked up in the thread pool);
    validate ``JobSubmit`` (422). The app's handlers (``problems.install_handlers``)
    render the errors, looked up as Starlette's exception middleware does, so a request
    gets the same answer through the router or through ``SubmitShortcut``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        return _handle  # (FastAPI builds its app of the route from it; ``handle`` serves POST)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            await super().handle(scope, receive, send)
            return
        request = Request(scope, receive, send)
        response = await answered(request, lambda: _handle(request))
        await response(scope, receive, send)


async def _handle(request: Request) -> Response:
    spec, parts, me = await _solve(request)
    return await submit(request, spec, parts, me)


router.add_api_route(
    "", submit, methods=["POST"], status_code=201, response_model=JobDetail, route_class_override=SubmitRoute
)
SUBMIT = next(r for r in router.routes if isinstance(r, SubmitRoute))


class SubmitShortcut:
    """Hands ``POST /v1/jobs`` to ``SubmitRoute`` without FastAPI's route matching, which
    walks the nested included routers: 0.04 to 0.07 ms of CPU a request (FastAPI 0.16x,
    measured in process). Without this shortcut ``bench/bench_api.py`` measured submits
    at 0.50 of the healthz rate instead of 0.63, and 0.82 API ms/job instead of 0.58
    (medians of five and three runs). It only routes: the caller, the body, the errors
    and the service are the route's, which answers the same when the router finds it.
    Innermost of the app's middleware: inside the body limit, the audit log, admission
    and the latency histogram (which labels by the route it sets, as the router would)."""

    def __init__(self, app: ASGIApp, *, path: str = "/v1/jobs") -> None:
        self.app = app
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == self.path and scope["method"] == "POST":
            scope["route"] = SUBMIT
            await SUBMIT.handle(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def _solve(request: Request) -> tuple[JobSubmit, Parts, Principal]:
    raw = _json_body(request, await request.body())
    parts = await get_parts(request)
    me = await current_principal(request, parts, request.headers.get("authorization"))
    if raw is _NO_BODY:
        missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
        raise RequestValidationError([missing])
    try:
        spec = JobSubmit.model_validate(raw, from_attributes=True)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=raw) from None
    return spec, parts, me


_NO_BODY: Any = object()


def _json_body(request: Request, body: bytes) -> Any:
    """The body as FastAPI hands it to validation: parsed when its Content-Type says
    JSON, the bytes when it says something else or nothing, ``_NO_BODY`` when empty."""
    if not body:
        return _NO_BODY
    content_type = request.headers.get("content-type")
    if content_type != "application/json" and not _is_json(content_type):
        return body
    try:
        return json.loads(body)
    except json.JSONDecodeError as exc:
        error = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error", "input": {}}
        raise RequestValidationError([{**error, "ctx": {"error": exc.msg}}], body=exc.doc) from exc
    except Exception as exc:  # FastAPI's answer to any other failure to parse (a too deep body)
        raise HTTPException(status_code=400, detail="There was an error parsing the body") from exc


def _is_json(content_type: str | None) -> bool:
    """``application/json`` or ``application/*+json``, parameters allowed: FastAPI's
    test (strict: a body without a Content-Type is not JSON)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
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
    array: IdQuery = None,
    job: Annotated[
        list[int], Query(max_length=1000, description="these jobs and arrays' tasks (repeat the parameter)")
    ] = [],  # noqa: B006
    since: Annotated[
        float | None, Query(allow_inf_nan=False, description="not ended before (epoch seconds)")
    ] = None,
    until: Annotated[
        float | None, Query(allow_inf_nan=False, description="submitted by (epoch seconds)")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[int | None, Query(ge=0, le=INT32)] = None,
    offset: Annotated[int | None, Query(ge=0, le=INT32)] = None,
    arrays: Annotated[
        Literal["expanded", "collapsed"],
        Query(
            description="collapsed: an array's tasks waiting in one state are one item (squeue's 123_[5-99])"
        ),
    ] = "expanded",
) -> Response:
    """The page comes as JSON from the service (``jobs.list_jobs``: written straight from
    the rows): returned as a model, FastAPI would dump, validate and serialise 1,000 jobs.
    ``since`` and ``until``: the jobs in the system at some time in that window
    (``gpufleet history``, sacct's ``-S``/``-E``). ``job``: only these jobs, and the
    tasks of the arrays with these ids (``sacct -j``: one job, not every job's pages);
    an id no job can have (out of PostgreSQL's integer) matches none, as ``/steps``.
    ``arrays=collapsed``: the waiting tasks of an array, per state, are one item (the
    first task's, at its place) with ``array_tasks`` (``5-9999``, ``1-3,7,9-12``) and
    ``array_task_count``; every other item has them null. A 10,000-task array is one
    item, not 10,000."""
    body = jobs.list_jobs(
        db=parts.db,
        actor=me,
        states=_states(state),
        user=user,
        team=team,
        pool=pool,
        array=array,
        ids=[j for j in job if 1 <= j <= INT32] if job else None,
        since=since,
        until=until,
        limit=limit,
        cursor=cursor,
        offset=offset,
        collapse=arrays == "collapsed",
    )
    return Response(body, media_type="application/json")


@router.post("/cancel", response_model=Cancelled)
def cancel_many(spec: CancelMany, parts: PartsDep, me: Me) -> Cancelled:
    """``scancel`` with filters: every job matching all the fields given (a whole array,
    a user's, a name, states), among your own (an operator: anyone's)."""
    states = _states(spec.states or [])
    return unwrap(jobs.cancel_many(db=parts.db, actor=me, spec=spec, states=states, now=parts.now()))


def _match(spec: JobMatch | CancelMany) -> bulkjobs.Match:
    return bulkjobs.Match(
        ids=spec.ids, array=spec.array, user=spec.user, states=_states(spec.states or []), name=spec.name
    )


@router.post("/hold", response_model=JobsChanged)
def hold_many(spec: JobMatch, parts: PartsDep, me: Me) -> JobsChanged:
    """``scontrol hold`` of every PENDING job matched (a whole array: ``{"array": 123}``),
    in one transaction whatever their number; the others are ``skipped``."""
    return unwrap(bulkjobs.hold_many(db=parts.db, actor=me, match=_match(spec), now=parts.now()))


@router.post("/release", response_model=JobsChanged)
def release_many(spec: JobMatch, parts: PartsDep, me: Me) -> JobsChanged:
    """``scontrol release`` of every HELD job matched, in one transaction."""
    return unwrap(bulkjobs.release_many(db=parts.db, actor=me, match=_match(spec), now=parts.now()))


@router.post("/update", response_model=JobsChanged)
def update_many(spec: JobsUpdate, parts: PartsDep, me: Me) -> JobsChanged:
    """``scontrol update`` of every live job matched (``set``: what ``PATCH
    /v1/jobs/{id}`` takes), in one transaction; a job that cannot take it is skipped."""
    match = _match(spec)
    return unwrap(bulkjobs.update_many(db=parts.db, actor=me, match=match, spec=spec.set, now=parts.now()))


@router.get("/{job_id}", response_model=JobDetail)
def show(job_id: ObjectId, parts: PartsDep, me: Me) -> JobDetail:
    return unwrap(jobs.show(db=parts.db, actor=me, job_id=job_id))


@router.post("/{job_id}/cancel", response_model=JobDetail)
def cancel(job_id: ObjectId, parts: PartsDep, me: Me) -> JobDetail:
    return unwrap(jobs.cancel(db=parts.db, actor=me, job_id=job_id, now=parts.now()))


@router.patch("/{job_id}", response_model=JobDetail)
def update(job_id: ObjectId, body: JobUpdate, parts: PartsDep, me: Me) -> JobDetail:
    """``scontrol update``: time limit (down only, except operators), name, held."""
    return unwrap(jobs.update(db=parts.db, actor=me, job_id=job_id, spec=body, now=parts.now()))


@router.post("/{job_id}/requeue", response_model=JobDetail)
def requeue(job_id: ObjectId, parts: PartsDep, me: Me) -> JobDetail:
    """``scontrol requeue``: a scheduled or running job back to PENDING (409 otherwise)."""
    return unwrap(jobs.requeue(db=parts.db, actor=me, job_id=job_id, now=parts.now()))


@router.post("/{job_id}/hold", response_model=JobDetail)
def hold(job_id: ObjectId, parts: PartsDep, me: Me) -> JobDetail:
    return unwrap(jobs.hold(db=parts.db, actor=me, job_id=job_id, now=parts.now()))


@router.post("/{job_id}/release", response_model=JobDetail)
def release(job_id: ObjectId, parts: PartsDep, me: Me) -> JobDetail:
    return unwrap(jobs.release(db=parts.db, actor=me, job_id=job_id, now=parts.now()))


@router.put("/{job_id}/priority", response_model=JobDetail)
def set_priority(job_id: ObjectId, body: PriorityChange, parts: PartsDep, me: Me) -> JobDetail:
    return unwrap(
        jobs.set_priority(
            db=parts.db,
            actor=me,
            job_id=job_id,
            priority=body.priority,
            now=parts.now(),
        )
    )
