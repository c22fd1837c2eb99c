"""What agents call (sync) and what operators call for them (join tokens, summary).

Sync authenticates either a node credential (``gfn_...``: it may speak only for its
own node) or an operator/admin token (any node); a plain user gets 403.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request
from starlette.concurrency import run_in_threadpool

from gpufleet.server.deps import Me, Parts, PartsDep, get_parts, get_principal
from gpufleet.server.hot import HotState, NodeCred
from gpufleet.server.problems import ProblemError, unwrap
from gpufleet.server.schemas import FleetSummary, JoinTokenIn, JoinTokenOut, NodeSync, SyncReply
from gpufleet.server.services import fleet, nodecreds, sync
from gpufleet.server.services.accounts import hash_token

router = APIRouter(tags=["nodes"])


async def get_hot(request: Request) -> HotState:
    hot: HotState = request.app.state.hot
    return hot


HotDep = Annotated[HotState, Depends(get_hot)]


def _bearer(authorization: str | None) -> str:
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ProblemError(401, "expected 'Authorization: Bearer <token>'", title="Unauthorized")
    return token.strip()


async def agent_actor(
    name: str,
    parts: Annotated[Parts, Depends(get_parts)],
    hot: HotDep,
    authorization: Annotated[str | None, Header()] = None,
) -> sync.AgentActor:
    """Async like ``get_principal``: a cached credential is answered on the event loop."""
    token = _bearer(authorization)
    if not nodecreds.is_node_token(token):
        who = await get_principal(parts, authorization)
        if not who.is_operator:
            raise ProblemError(403, "only node credentials, operators and admins may sync nodes")
        return sync.AgentActor(name=who.name, node=None)
    cred = hot.creds.get(hash_token(token))
    if cred is None or cred.node is None:
        cred = await run_in_threadpool(_resolve, parts, hot, token, name)
    return sync.AgentActor(name=f"node:{cred.node}", node=cred.node)


def _resolve(parts: Parts, hot: HotState, token: str, name: str) -> NodeCred:
    cred = nodecreds.authenticate_node(db=parts.db, token=token, cache=hot.creds)
    if cred is None:
        raise ProblemError(401, "invalid or revoked node credential", title="Unauthorized")
    return nodecreds.bind(writer=parts.writer, token=token, cred=cred, node=name, cache=hot.creds)


@router.post("/nodes/join-tokens", status_code=201, response_model=JoinTokenOut)
def create_join_token(parts: PartsDep, me: Me, spec: JoinTokenIn | None = None) -> JoinTokenOut:
    node = spec.node if spec is not None else None
    return unwrap(nodecreds.create_join_token(db=parts.db, actor=me, node=node, now=parts.now()))


@router.post("/nodes/{name}/sync", response_model=SyncReply)
def sync_node(
    name: str,
    body: NodeSync,
    parts: PartsDep,
    hot: HotDep,
    actor: Annotated[sync.AgentActor, Depends(agent_actor)],
) -> SyncReply:
    t0 = time.perf_counter()
    out = sync.sync_node(
        db=parts.db,
        writer=parts.writer,
        hot=hot,
        actor=actor,
        name=name,
        body=body,
        now=parts.now(),
        fleets_invalidate=parts.fleets.invalidate,
        waker=parts.scheduler.wake,
        readings=parts.readings,
    )
    hot.latencies.add(time.perf_counter() - t0)
    return unwrap(out)


@router.get("/fleet/summary", response_model=FleetSummary, tags=["fleet"])
def fleet_summary(parts: PartsDep, hot: HotDep, me: Me) -> FleetSummary:
    return fleet.summary(db=parts.db, hot=hot, live_since=parts.live_since())
