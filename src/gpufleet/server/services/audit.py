"""Reading the audit log (``server/audit.py`` writes it): admins only, newest first,
by user and time, a page at a time (keyset on the row id, as ``pages.py``)."""

from __future__ import annotations

from sqlalchemy import select

from gpufleet.api.audit import AuditOut, AuditPage
from gpufleet.server.db import Database
from gpufleet.server.models import AuditRow
from gpufleet.server.pages import cut, id_cursor
from gpufleet.server.problems import Failure, forbidden, invalid
from gpufleet.server.services.auth import Principal


def list_audit(
    *,
    db: Database,
    actor: Principal,
    user: str | None = None,
    since: float | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> AuditPage | Failure:
    if not actor.is_admin:
        return forbidden("only admins read the audit log")
    try:
        before = id_cursor(cursor)
    except ValueError:
        return invalid(f"cursor: {cursor!r} is not a cursor this list gave")
    q = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit + 1)
    if user is not None:
        q = q.where(AuditRow.actor == user)
    if since is not None:
        q = q.where(AuditRow.at >= since)
    if before is not None:
        q = q.where(AuditRow.id < before)
    with db.read() as s:
        rows, after = cut(list(s.scalars(q)), limit, lambda r: str(r.id))
    return AuditPage(
        items=[
            AuditOut(
                id=r.id,
                at=r.at,
                actor=r.actor,
                role=r.role,
                token_id=r.token_id,
                address=r.address,
                method=r.method,
                path=r.path,
                object=r.object,
                status=r.status,
            )
            for r in rows
        ],
        next_cursor=after,
    )
