"""Reading the audit log (``server/http/audit.py`` writes it): admins only, newest first,
by user and time, a page at a time (keyset on the row id, as ``pages.py``)."""

from __future__ import annotations

from sqlalchemy import delete, select

from gpufleet.api.audit import AuditOut, AuditPage
from gpufleet.server.problems import Failure, forbidden, invalid
from gpufleet.server.services.auth import Principal
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import AuditRow
from gpufleet.server.store.pages import cut, id_cursor


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


def purge(db: Database, *, before: float, chunk: int = 5000) -> int:
    """Delete rows older than ``before``, ``chunk`` at a time (short write transactions:
    the group commit and the scheduler are not held up by one long delete)."""
    gone = 0
    while True:
        with db.write() as s:
            ids = list(
                s.scalars(select(AuditRow.id).where(AuditRow.at < before).order_by(AuditRow.id).limit(chunk))
            )
            if ids:
                s.execute(delete(AuditRow).where(AuditRow.id.in_(ids)))
        gone += len(ids)
        if len(ids) < chunk:
            return gone
