"""What agents call (sync, certificate) and what operators call for them (join tokens,
credentials, revoke, summary).

Sync authenticates a node certificate (mTLS: the node is the certificate's subject,
its serial must not be revoked), a node credential (``gfn_...``: it may speak only for
its own node; refused for syncs when the server requires certificates, where it only
buys the certificate), or an operator/admin token (any node); a plain user gets 403.

The node's name in the path is at most 63 characters of letters, digits, ``.``, ``_``
and ``-`` (``schemas.NODE_NAME``): a longer or odder one is a 422 before any credential
is looked at or bound to it.
"""

from __future__ import annotations

import functools
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Depends, Header, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpufleet.api.base import NODE_NAME, Reply
from gpufleet.api.credentials import CertificateIn, CertificateOut, NodeCredentialList, RevokedOut
from gpufleet.api.nodes import (
    FleetSummary,
    JoinTokenIn,
    JoinTokenOut,
    NodeRenew,
    NodeSync,
    RenewReply,
    SyncReply,
    WaitReply,
)
from gpufleet.server.errors import ProblemError
from gpufleet.server.http.audit import Actor, note_actor
from gpufleet.server.http.deps import Me, NodeNameIn, Parts, PartsDep, get_parts, get_principal
from gpufleet.server.problems import answered, unwrap
from gpufleet.server.routers.paging import Cursor, Limit
from gpufleet.server.services import fleet, nodecreds, renew, steps, sync
from gpufleet.server.services.auth import hash_token, hasher_for
from gpufleet.server.store.agentstate import AgentState, NodeCred
from gpufleet.server.store.dispatch import NodeBell
from gpufleet.tlsproto import peer_certificate

if TYPE_CHECKING:
    from gpufleet.pki import PeerIdentity

router = APIRouter(tags=["nodes"])


async def get_hot(request: Request) -> AgentState:
    hot: AgentState = request.app.state.hot
    return hot


HotDep = Annotated[AgentState, Depends(get_hot)]


def _bearer(authorization: str | None) -> str:
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ProblemError(401, "expected 'Authorization: Bearer <token>'", title="Unauthorized")
    return token.strip()


async def agent_actor(
    name: NodeNameIn,
    request: Request,
    parts: Annotated[Parts, Depends(get_parts)],
    hot: HotDep,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> sync.AgentActor:
    """Async like ``get_principal``: a cached credential is answered on the event loop."""
    return await _actor(name, request, parts, hot, authorization, certificate_only=False)


async def _actor(
    name: str,
    request: Request,
    parts: Parts,
    hot: AgentState,
    authorization: str | None,
    *,
    certificate_only: bool,
) -> sync.AgentActor:
    pem = peer_certificate(request.scope)
    if pem is not None:
        peer = _peer(pem)
        if peer is not None:
            if hot.revocations.stale():
                await run_in_threadpool(nodecreds.refresh_revocations, parts.db, hot.revocations)
            if hot.revocations.revoked(peer.serial):
                raise ProblemError(401, f"node certificate {peer.serial} is revoked", title="Unauthorized")
            note_actor(request.scope, Actor(name=f"node:{peer.node}", role="node"))
            return sync.AgentActor(name=f"node:{peer.node}", node=peer.node)
    token = _bearer(authorization)
    if not nodecreds.is_node_token(token):
        who = await get_principal(parts, authorization)
        note_actor(request.scope, Actor(name=who.name, role=who.role, token_id=who.token_id))
        if not who.is_operator:
            raise ProblemError(403, "only node credentials, operators and admins may sync nodes")
        return sync.AgentActor(name=who.name, node=None)
    if certificate_only and parts.config.node_certs_required:
        raise ProblemError(
            401,
            "this server takes node certificates: run the agent with an https:// --server and --ca-file",
            title="Unauthorized",
        )
    cred = hot.creds.get(hash_token(token))
    if cred is None or cred.node is None:
        cred = await run_in_threadpool(_resolve, parts, hot, token, name)
    note_actor(request.scope, Actor(name=f"node:{cred.node}", role="node"))
    return sync.AgentActor(name=f"node:{cred.node}", node=cred.node, credential_id=cred.id)


@functools.lru_cache(maxsize=4096)
def _peer(pem: str) -> PeerIdentity | None:
    """The node a (TLS-verified) client certificate names; parsed once per certificate."""
    from gpufleet.pki import node_identity  # (only with TLS: see app._load_ca)

    return node_identity(ssl.PEM_cert_to_DER_cert(pem))


def _resolve(parts: Parts, hot: AgentState, token: str, name: str) -> NodeCred:
    cred = nodecreds.authenticate_node(db=parts.db, token=token, cache=hot.creds, hasher=parts.hasher)
    if isinstance(cred, str):
        raise ProblemError(401, cred, title="Unauthorized")
    return nodecreds.bind(writer=parts.writer, token=token, cred=cred, node=name, cache=hot.creds)


@router.post("/nodes/join-tokens", status_code=201, response_model=JoinTokenOut)
def create_join_token(parts: PartsDep, me: Me, spec: JoinTokenIn | None = None) -> JoinTokenOut:
    node = spec.node if spec is not None else None
    ttl = spec.ttl if spec is not None else None
    return unwrap(
        nodecreds.create_join_token(
            db=parts.db, actor=me, node=node, now=parts.now(), ttl_s=ttl, hasher=parts.hasher
        )
    )


async def sync_actor(
    name: NodeNameIn,
    request: Request,
    parts: Annotated[Parts, Depends(get_parts)],
    hot: HotDep,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> sync.AgentActor:
    """Who syncs: as ``agent_actor``, but a join token is refused where the server
    requires node certificates."""
    return await _actor(name, request, parts, hot, authorization, certificate_only=True)


@router.post("/nodes/{name}/certificate", status_code=201, response_model=CertificateOut)
def node_certificate(
    name: NodeNameIn,
    body: CertificateIn,
    request: Request,
    parts: PartsDep,
    hot: HotDep,
    actor: Annotated[sync.AgentActor, Depends(agent_actor)],
) -> CertificateOut:
    """Trade a join token (once, before it expires), an operator's token or this node's
    current certificate, and a CSR, for the node's client certificate."""
    if actor.node is not None and actor.node != name:
        raise ProblemError(403, f"this credential belongs to node {actor.node}, not {name}")
    out = nodecreds.issue_certificate(
        db=parts.db,
        ca=request.app.state.ca,
        node=name,
        csr=body.csr,
        actor=actor.name,
        credential_id=actor.credential_id,
        now=parts.now(),
    )
    if actor.credential_id is not None:
        hot.creds.clear()  # the join token is spent (or was refused): no cached pass for it
    return unwrap(out)


@router.get("/node-credentials", response_model=NodeCredentialList)
def node_credentials(
    parts: PartsDep, me: Me, node: str | None = None, limit: Limit = 100, cursor: Cursor = None
) -> NodeCredentialList:
    return unwrap(nodecreds.list_credentials(db=parts.db, actor=me, node=node, limit=limit, cursor=cursor))


@router.post("/nodes/{name}/revoke", response_model=RevokedOut)
def revoke_node(name: str, parts: PartsDep, hot: HotDep, me: Me) -> RevokedOut:
    out = nodecreds.revoke_node(
        db=parts.db, actor=me, node=name, now=parts.now(), cache=hot.creds, revocations=hot.revocations
    )
    return unwrap(out)


@router.post("/nodes/{name}/sync", response_model=SyncReply)
def sync_node(
    name: NodeNameIn,
    body: NodeSync,
    request: Request,
    parts: PartsDep,
    hot: HotDep,
    actor: Annotated[sync.AgentActor, Depends(sync_actor)],
) -> SyncReply:
    t0 = time.perf_counter()
    bell: NodeBell = request.app.state.bell
    version = bell.version(name)  # before the sync reads what the node should run (a lease's base)
    out = sync.sync_node(
        db=parts.db,
        writer=parts.writer,
        hot=hot,
        actor=actor,
        name=name,
        body=body,
        now=parts.now(),
        readings=parts.readings,
        log_max_bytes=parts.config.job_log_max_bytes,
        version=version,
    )
    reply = unwrap(out)
    if reply.jobs:  # each job's own credential (``services/steps.py``), derived, never stored
        reply = steps.with_credentials(reply, hasher_for(parts.db, parts.hasher))
    hot.latencies.add(time.perf_counter() - t0)
    return reply


@router.post("/nodes/{name}/renew", response_model=RenewReply)
async def renew_node(
    name: NodeNameIn,
    body: NodeRenew,
    request: Request,
    parts: PartsDep,
    hot: HotDep,
    actor: Annotated[sync.AgentActor, Depends(sync_actor)],
) -> RenewReply:
    """An idle node's lease renewal (``services/renew.py``): memory only, so it is
    answered on the event loop. Who may renew: whoever may sync this node."""
    return _renewed(request, parts, hot, actor, name, body.lease)


def _renewed(
    request: Request, parts: Parts, hot: AgentState, actor: sync.AgentActor, name: str, lease: str
) -> RenewReply:
    """The renewal, the caller checked (the route's and ``AgentShortcut``'s)."""
    bell: NodeBell = request.app.state.bell
    out = renew.renew_node(
        hot=hot,
        writer=parts.writer,
        actor=actor,
        name=name,
        lease=lease,
        version=bell.version(name),
        now=parts.now(),
    )
    return unwrap(out)


WAIT_MAX_S = 60.0


@router.get("/nodes/{name}/wait", response_model=WaitReply)
async def wait_node(
    name: NodeNameIn,
    request: Request,
    actor: Annotated[sync.AgentActor, Depends(sync_actor)],
    seen: Annotated[str | None, Query(max_length=64, description="the version the agent last saw")] = None,
    timeout: Annotated[float, Query(ge=0, le=WAIT_MAX_S, allow_inf_nan=False)] = 20.0,
) -> WaitReply:
    """The agent's long-poll (``dispatch.py``): answered as soon as the node's version
    differs from ``seen`` (at once if it already does), else after ``timeout`` seconds
    with the same version. It holds no lane seat and no thread while it waits. Who may
    wait: whoever may sync this node."""
    return await _waited(request, actor, name, seen, timeout)


async def _waited(
    request: Request, actor: sync.AgentActor, name: str, seen: str | None, timeout: float
) -> WaitReply:
    """The long-poll, the caller checked (the route's and ``AgentShortcut``'s)."""
    if actor.node is not None and actor.node != name:
        raise ProblemError(403, f"this node credential belongs to node {actor.node}, not {name}")
    bell: NodeBell = request.app.state.bell
    return WaitReply(node=name, version=await bell.wait(name, seen, timeout))


@router.get("/fleet/summary", response_model=FleetSummary, tags=["fleet"])
def fleet_summary(parts: PartsDep, hot: HotDep, me: Me) -> FleetSummary:
    return fleet.summary(db=parts.db, hot=hot, live_since=parts.live_since())


# -- the idle fleet's two requests, unrouted ---------------------------------------------

RENEW = next(r for r in router.routes if getattr(r, "path", None) == "/nodes/{name}/renew")
WAIT = next(r for r in router.routes if getattr(r, "path", None) == "/nodes/{name}/wait")
_NAME = re.compile(NODE_NAME.removeprefix("^").removesuffix("$"))
"""``NODE_NAME`` for ``fullmatch``: its ``$`` would let a name end in a newline."""
_TIMEOUT = re.compile(r"[0-9]{1,2}(?:\.[0-9]{1,20})?")
_NODES = "/v1/nodes/"


class AgentShortcut:
    """Answers an idle node's two periodic requests, ``POST /v1/nodes/{name}/renew`` and
    ``GET /v1/nodes/{name}/wait``, without FastAPI's route matching, dependency solving and
    response-model validation. At rest they are nearly all a fleet's requests, and that
    machinery was most of the server's CPU at rest (``bench/bench_idle.py``, py-spy: 60 of
    115 busy samples in a 50-node fleet; the renewal itself 10).

    Only the ordinary request is answered here: a valid node name, for a renewal a JSON
    body that ``NodeRenew`` validates, for a long-poll at most one ``seen`` (64 characters)
    and one plain-decimal ``timeout`` within ``[0, WAIT_MAX_S]``. Anything else goes on, its
    body replayed, to the router and the route, which answer it as they always did (422 and
    the rest). The caller is checked by the routes' own function (``_actor``, as
    ``sync_actor``), its refusals rendered by the app's handlers, so an answer is the same
    either way. Innermost, beside ``jobs.SubmitShortcut``: inside admission (lanes, rate
    limits, the 401 counting), the body limit, the audit log and the latency histogram
    (labelled by the route set here, as the router would)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"] if scope["type"] == "http" else ""
        if path.startswith(_NODES):
            name, _, action = path[len(_NODES) :].partition("/")
            method = scope["method"]
            if action == "renew" and method == "POST" and _NAME.fullmatch(name):
                await self._renew(name, scope, receive, send)
                return
            if action == "wait" and method == "GET" and _NAME.fullmatch(name):
                await self._wait(name, scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _renew(self, name: str, scope: Scope, receive: Receive, send: Send) -> None:
        body, receive = await _whole_body(receive)
        lease = _lease(scope, body)
        if lease is None:
            await self.app(scope, receive, send)  # the route's validation answers
            return

        async def answer(request: Request, parts: Parts, hot: AgentState, actor: sync.AgentActor) -> Response:
            return _json(_renewed(request, parts, hot, actor, name, lease))

        await _serve(RENEW, name, scope, receive, send, answer)

    async def _wait(self, name: str, scope: Scope, receive: Receive, send: Send) -> None:
        query = _wait_query(scope.get("query_string", b""))
        if query is None:
            await self.app(scope, receive, send)
            return
        seen, timeout = query

        async def answer(request: Request, parts: Parts, hot: AgentState, actor: sync.AgentActor) -> Response:
            return _json(await _waited(request, actor, name, seen, timeout))

        await _serve(WAIT, name, scope, receive, send, answer)


async def _serve(
    route: Any,
    name: str,
    scope: Scope,
    receive: Receive,
    send: Send,
    answer: Callable[[Request, Parts, AgentState, sync.AgentActor], Awaitable[Response]],
) -> None:
    scope["route"] = route
    scope["path_params"] = {"name": name}
    request = Request(scope, receive, send)

    async def checked() -> Response:
        parts = await get_parts(request)
        hot: AgentState = request.app.state.hot
        actor = await _actor(
            name, request, parts, hot, request.headers.get("authorization"), certificate_only=True
        )
        return await answer(request, parts, hot, actor)

    response = await answered(request, checked)
    await response(scope, receive, send)


def _json(reply: Reply) -> Response:
    return Response(reply.model_dump_json(), media_type="application/json")


async def _whole_body(receive: Receive) -> tuple[bytes, Receive]:
    """The request's body (admission has read it already; the body limit is outside) and
    a ``receive`` that hands it out again, then the connection's own messages."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(parts), _replay(b"".join(parts), message, receive)
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            body = b"".join(parts)
            return body, _replay(body, None, receive)


def _replay(body: bytes, last: Message | None, receive: Receive) -> Receive:
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
    if last is not None:
        pending.append(last)

    async def again() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return again


def _lease(scope: Scope, body: bytes) -> str | None:
    """The renewal's lease when the request is the ordinary one (JSON that ``NodeRenew``
    takes); None: the route decides."""
    ctype = None
    for key, value in scope["headers"]:
        if key == b"content-type":
            ctype = value
            break
    if ctype != b"application/json" or not body:
        return None
    try:
        return NodeRenew.model_validate_json(body).lease
    except ValueError:
        return None


def _wait_query(raw: bytes) -> tuple[str | None, float] | None:
    """(seen, timeout) of an ordinary long-poll's query; None: the route decides."""
    seen: str | None = None
    timeout = 20.0
    got: set[str] = set()
    for key, value in parse_qsl(raw.decode("latin-1"), keep_blank_values=True):
        if key in got:
            return None
        got.add(key)
        if key == "seen":
            if len(value) > 64:
                return None
            seen = value
        elif key == "timeout":
            if not _TIMEOUT.fullmatch(value) or float(value) > WAIT_MAX_S:
                return None
            timeout = float(value)
    return seen, timeout
