"""Request-scoped dependencies: the server's parts and the calling principal.

Both are ``async``: FastAPI runs a sync dependency in its thread pool, a hand-off that
costs more than the dependency itself. The token check answers from the token cache
on the event loop; only a miss goes to the database, in the thread pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Header, Path, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from gpufleet.api.base import NODE_NAME
from gpufleet.clock import Clock
from gpufleet.server.config import ServerConfig
from gpufleet.server.http.audit import note_principal
from gpufleet.server.problems import ProblemError
from gpufleet.server.runner import Runner
from gpufleet.server.services import steps
from gpufleet.server.services.auth import Principal, Refused, TokenCache, check_token, hash_token, hasher_for
from gpufleet.server.services.caps import PendingCounts
from gpufleet.server.services.chargeback import BudgetWarnings
from gpufleet.server.services.inventory import FleetCache
from gpufleet.server.store.db import Database
from gpufleet.server.store.ledger import Readings, no_readings
from gpufleet.server.store.tokenkey import TokenHasher
from gpufleet.server.store.writer import Writer


@dataclass(frozen=True, slots=True, kw_only=True)
class Parts:
    """What routers hand to services, built once per app."""

    config: ServerConfig
    db: Database
    clock: Clock
    scheduler: Runner
    """The scheduling loop (a thread's or the child process's): routers wake it."""
    replicas: Runner
    """The replica controller of inference services: service changes wake it."""
    fleets: FleetCache
    tokens: TokenCache
    writer: Writer
    budget_warnings: BudgetWarnings = field(default_factory=BudgetWarnings)
    """Soft-budget warnings per team, refreshed by the accrual loop."""
    readings: Readings = no_readings
    """The agents' latest GPU readings (energy and utilisation accrue from them)."""
    pending: PendingCounts = field(default_factory=lambda: PendingCounts(cap=0))
    """Each user's queued jobs, for the cap on them (``services/caps.py``; cap 0: none)."""

    def now(self) -> float:
        return self.clock.now()

    @property
    def hasher(self) -> TokenHasher | None:
        """The key tokens are stored under (``tokenkey.py``), which the token cache holds."""
        return self.tokens.hasher

    def live_since(self) -> float:
        return self.clock.now() - self.config.node_timeout_s


async def get_parts(request: Request) -> Parts:
    parts: Parts = request.app.state.parts
    return parts


async def get_principal(
    parts: Annotated[Parts, Depends(get_parts)],
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Principal:
    if not authorization:
        raise ProblemError(401, "missing bearer token (Authorization: Bearer <token>)", title="Unauthorized")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ProblemError(401, "expected 'Authorization: Bearer <token>'", title="Unauthorized")
    token = token.strip()
    if token.startswith(steps.PREFIX):  # a job's own credential (issue 31): checked every time
        hasher = hasher_for(parts.db, parts.hasher)
        job = await run_in_threadpool(steps.check_job_credential, parts.db, token, hasher)
        if isinstance(job, Refused):
            raise ProblemError(401, job.detail, title="Unauthorized")
        return job
    who: Principal | Refused | None = parts.tokens.get(hash_token(token))
    if who is None:
        who = await run_in_threadpool(check_token, db=parts.db, token=token, cache=parts.tokens)
    if isinstance(who, Refused):
        raise ProblemError(401, who.detail, title="Unauthorized")
    return who


BEARER = HTTPBearer(auto_error=False, description="An API token, web session or node credential.")
"""Declares the bearer scheme in the OpenAPI document (the header is read as it is,
so the 401 details stay ours)."""
AuthHeader = Annotated[str | None, Header(include_in_schema=False)]


async def current_principal(
    request: Request,
    parts: Annotated[Parts, Depends(get_parts)],
    authorization: AuthHeader = None,
    _scheme: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)] = None,
) -> Principal:
    """``get_principal``, noted in the request for the audit log (``audit.py``)."""
    who = await get_principal(parts, authorization)
    note_principal(request.scope, who)
    return who


PartsDep = Annotated[Parts, Depends(get_parts)]
NodeNameIn = Annotated[
    str,
    Path(pattern=NODE_NAME, description="at most 63 characters: letters, digits, '.', '_', '-'"),
]
"""A node's name where a request creates or changes a node (``schemas.NODE_NAME``);
reads and removal take any name, so a node registered before the limit can still be
seen and removed."""
Me = Annotated[Principal, Depends(current_principal)]
