"""``GET /v1/fleet/servers``: the servers of this database and who leads (``leader.py``)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from sqlalchemy.exc import SQLAlchemyError

from gpufleet import __version__
from gpufleet.api.fleet import ServerOut, ServersOut
from gpufleet.server.errors import ProblemError
from gpufleet.server.http.deps import Me, PartsDep
from gpufleet.server.store import leader

router = APIRouter(tags=["fleet"])


@router.get("/fleet/servers", response_model=ServersOut)
def servers(request: Request, parts: PartsDep, me: Me) -> ServersOut:
    """Anyone signed in: which servers answer, which one runs the loops, its epoch and
    the age of its lease."""
    me_id: str = request.app.state.server_id
    if parts.db.is_sqlite:
        started = float(getattr(request.app.state, "started_at", time.time()))
        alone = ServerOut(
            id=me_id, url="", version=__version__, started_at=started, seen_s_ago=0.0, up=True, leader=True
        )
        return ServersOut(mode="single", me=me_id, leader=me_id, epoch=0, lease_age_s=None, servers=[alone])
    try:
        got = leader.servers(parts.db.engine, parts.config.leader_ttl_s)
    except SQLAlchemyError as exc:
        raise ProblemError(503, f"database unreachable: {exc.__class__.__name__}") from exc
    return ServersOut(mode="ha", me=me_id, **got)
