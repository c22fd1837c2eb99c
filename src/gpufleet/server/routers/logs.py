"""``GET /v1/jobs/{id}/logs[?follow=true]``: a job's output as text/plain.

Without ``follow`` the answer is the log so far. With it the response streams: new
output as it arrives (polled every ``POLL_S``), ending once the job is over and its
nodes confirmed it stopped (its last output has then arrived), or when the client
disconnects.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

import anyio
from fastapi import APIRouter
from starlette.responses import PlainTextResponse, StreamingResponse

from gpufleet.server.http.deps import Me, PartsDep
from gpufleet.server.problems import Failure, ObjectId, unwrap
from gpufleet.server.services import logs
from gpufleet.server.services.auth import Principal
from gpufleet.server.store.db import Database

router = APIRouter(tags=["jobs"])
POLL_S = 0.5
TEXT = "text/plain; charset=utf-8"


@router.get(
    "/jobs/{job_id}/logs",
    response_class=PlainTextResponse,
    response_model=None,
    responses={200: {"content": {"text/plain": {}}}, 404: {"description": "no such job (or not yours)"}},
)
def job_logs(
    job_id: ObjectId, parts: PartsDep, me: Me, follow: bool = False
) -> PlainTextResponse | StreamingResponse:
    page = unwrap(logs.read_logs(db=parts.db, actor=me, job_id=job_id))
    if follow:
        return StreamingResponse(_follow(parts.db, me, job_id, page), media_type=TEXT)
    out = list(page.chunks)
    while page.chunks:
        page = unwrap(logs.read_logs(db=parts.db, actor=me, job_id=job_id, after=page.last_id))
        out += page.chunks
    return PlainTextResponse("".join(out), media_type=TEXT)


async def _follow(db: Database, me: Principal, job_id: int, first: logs.LogPage) -> AsyncIterator[str]:
    page = first
    while True:
        for chunk in page.chunks:
            yield chunk
        if page.finished and not page.chunks:
            return
        if not page.chunks:
            await anyio.sleep(POLL_S)
        nxt = await anyio.to_thread.run_sync(
            partial(logs.read_logs, db=db, actor=me, job_id=job_id, after=page.last_id)
        )
        if isinstance(nxt, Failure):
            return
        page = nxt
