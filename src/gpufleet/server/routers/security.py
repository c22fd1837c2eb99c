"""Web sessions (``POST /v1/sessions``) and the audit log (``GET /v1/audit``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gpufleet.api.audit import AuditPage
from gpufleet.api.users import TokenCreated
from gpufleet.server.http.deps import Me, PartsDep
from gpufleet.server.problems import unwrap
from gpufleet.server.routers.paging import Cursor, Limit
from gpufleet.server.services import audit as audit_service
from gpufleet.server.services import tokens

router = APIRouter()


@router.post("/sessions", status_code=201, response_model=TokenCreated, tags=["tokens"])
def create_session(parts: PartsDep, me: Me) -> TokenCreated:
    """Trade the API token of this request for a web session token (``--session-ttl``,
    12 h by default; never past the API token's own expiry). The fleet page signs in
    this way and keeps only the session in the browser; ``DELETE /v1/tokens/{id}`` ends it."""
    made = tokens.create_session(
        db=parts.db, actor=me, now=parts.now(), hasher=parts.hasher, ttl_s=parts.config.session_ttl_s
    )
    return unwrap(made)


@router.get("/audit", response_model=AuditPage, tags=["audit"])
def list_audit(
    parts: PartsDep,
    me: Me,
    user: str | None = None,
    since: Annotated[float | None, Query(description="UNIX seconds: rows at or after")] = None,
    limit: Limit = 100,
    cursor: Cursor = None,
) -> AuditPage:
    """Mutating requests, newest first (admins only)."""
    return unwrap(
        audit_service.list_audit(db=parts.db, actor=me, user=user, since=since, limit=limit, cursor=cursor)
    )
