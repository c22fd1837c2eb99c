"""Jobs: submit, list, show, cancel, hold, release, priority.

``FastSubmit`` serves the plain case of ``POST /v1/jobs`` before FastAPI's routing (see
its docstring); every other request, and every submission it does not take, goes to
the routes here."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpufleet.server.audit import note_object, note_principal
from gpufleet.server.deps import Me, Parts, PartsDep, cached_principal
from gpufleet.server.jobstate.states import JobState
from gpufleet.server.problems import Failure, ObjectId, ProblemError, problem_response, unwrap
from gpufleet.server.schemas import JobDetail, JobPage, JobSubmit, PriorityChange
from gpufleet.server.services import jobs
from gpufleet.server.services.auth import Principal

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.post("", status_code=201, response_model=JobDetail)
async def submit(spec: JobSubmit, parts: PartsDep, me: Me) -> Response:
    """Async (the only async handler here): it waits on the group commit, not in a
    thread of the pool, so a submit costs no thread hand-off. The reply is serialised
    here, once: the service built it from validated values, so FastAPI's validation of
    the returned model against ``response_model`` would only repeat work."""
    return _created(unwrap(await _submit(parts, me, spec)))


async def _submit(parts: Parts, me: Principal, spec: JobSubmit) -> JobDetail | Failure:
    return await jobs.submit(
        writer=parts.writer,
        actor=me,
        spec=spec,
        now=parts.now(),
        fleets=parts.fleets,
        waker=parts.scheduler.wake,
        budget_warning=parts.budget_warnings.get,
        pending=parts.pending,
    )


def _created(out: JobDetail) -> Response:
    return Response(out.model_dump_json(), status_code=201, media_type="application/json")


class FastSubmit:
    """``POST /v1/jobs`` without FastAPI's per-request machinery (routing, dependency
    solving, body parsing: about 0.25 ms of CPU a request, a sixth of what a submit costs
    the API process). A pure ASGI middleware, innermost of the app's own (inside the body
    limit and the latency histogram, which see it as the route).

    It takes only the plain case: ``Content-Type: application/json``, a bearer token the
    token cache knows, a body that is JSON and validates as ``JobSubmit`` (the same
    ``json.loads`` + model validation FastAPI does). For anything else it hands the
    request to the app with the body it read replayed, so the route answers exactly as
    before: errors, token look-ups in the database, everything. A submission it took
    and the service refused is the same problem+json the route's ``unwrap`` gives.
    """

    def __init__(self, app: ASGIApp, *, parts: Parts, path: str = "/v1/jobs") -> None:
        self.app = app
        self.parts = parts
        self.path = path
        self.route = next(r for r in router.routes if isinstance(r, APIRoute) and r.endpoint is submit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        me = self._plain(scope)
        if me is None:
            await self.app(scope, receive, send)
            return
        body, more = await _read(receive)
        spec = None if more else _spec(body)
        if spec is None:
            await self.app(scope, _replay(body, more, receive), send)
            return
        scope["route"] = self.route  # what the latency histogram labels by
        note_principal(scope, me)  # for the audit log, as the ``Me`` dependency does
        out = await _submit(self.parts, me, spec)
        if isinstance(out, Failure):  # what ``unwrap`` and the ProblemError handler make of it
            await problem_response(Request(scope), out.kind.value, out.detail)(scope, receive, send)
            return
        note_object(scope, out.id)
        await _created(out)(scope, receive, send)

    def _plain(self, scope: Scope) -> Principal | None:
        content_type = authorization = None
        for name, value in scope["headers"]:
            if name == b"content-type" and content_type is None:
                content_type = value
            elif name == b"authorization" and authorization is None:
                authorization = value.decode("latin-1")
        if content_type != b"application/json":
            return None
        return cached_principal(self.parts.tokens, authorization)


async def _read(receive: Receive) -> tuple[bytes, list[Message]]:
    """The request body; a message other than a body part (a disconnect) stops the
    reading and is kept, for the app to receive after the replayed body."""
    chunks: list[bytes] = []
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            return b"".join(chunks), [msg]
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            return b"".join(chunks), []


def _spec(body: bytes) -> JobSubmit | None:
    try:
        raw: Any = json.loads(body)
        return JobSubmit.model_validate(raw)
    except (ValueError, ValidationError, RecursionError):  # JSONDecodeError is a ValueError
        return None  # the routed path answers it (a too deep body: problems.install_handlers)


def _replay(body: bytes, more: list[Message], receive: Receive) -> Receive:
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}, *more]

    async def again() -> Message:
        return pending.pop(0) if pending else await receive()

    return again


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
) -> Response:
    """The page is serialised here, once (its items were just validated as ``JobOut``):
    returned as a model, FastAPI would dump, validate and serialise 1,000 jobs again."""
    page = jobs.list_jobs(
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
    return Response(page.model_dump_json(), media_type="application/json")


@router.get("/{job_id}", response_model=JobDetail)
def show(job_id: ObjectId, parts: PartsDep, me: Me) -> JobDetail:
    return unwrap(jobs.show(db=parts.db, actor=me, job_id=job_id))


@router.post("/{job_id}/cancel", response_model=JobDetail)
def cancel(job_id: ObjectId, parts: PartsDep, me: Me) -> JobDetail:
    return unwrap(
        jobs.cancel(db=parts.db, actor=me, job_id=job_id, now=parts.now(), waker=parts.scheduler.wake)
    )


@router.post("/{job_id}/hold", response_model=JobDetail)
def hold(job_id: ObjectId, parts: PartsDep, me: Me) -> JobDetail:
    return unwrap(jobs.hold(db=parts.db, actor=me, job_id=job_id, now=parts.now()))


@router.post("/{job_id}/release", response_model=JobDetail)
def release(job_id: ObjectId, parts: PartsDep, me: Me) -> JobDetail:
    return unwrap(
        jobs.release(db=parts.db, actor=me, job_id=job_id, now=parts.now(), waker=parts.scheduler.wake)
    )


@router.put("/{job_id}/priority", response_model=JobDetail)
def set_priority(job_id: ObjectId, body: PriorityChange, parts: PartsDep, me: Me) -> JobDetail:
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
