"""A service's gateway tokens (``gpufleet service token NAME``): created (shown once),
listed, revoked. Only their sha256 is kept: 256 random bits need no salt or key, and the
gateways check a caller's token against the digests of the feed without the server's
key. At most ``MAX_TOKENS`` live per service (rotate: create one, then revoke the old)."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select

from gpufleet.api.services import ServiceTokenOut
from gpufleet.server.problems import Failure, conflict, not_found
from gpufleet.server.services.auth import Principal
from gpufleet.server.services.inference import add_event, load_active, load_service
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import ServiceToken

MAX_TOKENS = 16


def hash_service_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _token_out(t: ServiceToken, token: str | None = None) -> ServiceTokenOut:
    return ServiceTokenOut(
        id=t.id,
        hint=t.hint,
        created_at=t.created_at,
        created_by=t.created_by,
        revoked_at=t.revoked_at,
        token=token,
    )


def create_token(*, db: Database, actor: Principal, name: str, now: float) -> ServiceTokenOut | Failure:
    with db.write() as s:
        row = load_active(s, actor, name)
        if isinstance(row, Failure):
            return row
        live = s.scalars(
            select(ServiceToken.id).where(
                ServiceToken.service_id == row.id, ServiceToken.revoked_at.is_(None)
            )
        ).all()
        if len(live) >= MAX_TOKENS:
            return conflict(
                f"service {name} has {len(live)} live tokens (at most {MAX_TOKENS}): revoke one first"
            )
        token = "gfs_" + secrets.token_urlsafe(32)
        t = ServiceToken(
            service_id=row.id,
            token_hash=hash_service_token(token),
            hint=token[:8],
            created_at=now,
            created_by=actor.name[:64],
        )
        s.add(t)
        s.flush()
        add_event(
            s, row.id, at=now, actor=actor.name, kind="token", reason=f"token {t.id} ({t.hint}...) created"
        )
        return _token_out(t, token)


def list_tokens(*, db: Database, actor: Principal, name: str) -> list[ServiceTokenOut] | Failure:
    with db.read() as s:
        row = load_service(s, actor, name)
        if isinstance(row, Failure):
            return row
        q = select(ServiceToken).where(ServiceToken.service_id == row.id).order_by(ServiceToken.id)
        return [_token_out(t) for t in s.scalars(q)]


def revoke_token(
    *, db: Database, actor: Principal, name: str, token_id: int, now: float
) -> ServiceTokenOut | Failure:
    with db.write() as s:
        row = load_service(s, actor, name)
        if isinstance(row, Failure):
            return row
        t = s.get(ServiceToken, token_id)
        if t is None or t.service_id != row.id:
            return not_found(f"service {name} has no token {token_id}")
        if t.revoked_at is None:
            t.revoked_at = now
            add_event(s, row.id, at=now, actor=actor.name, kind="token", reason=f"token {t.id} revoked")
        return _token_out(t)
