"""API tokens and web sessions (who is calling: ``services/auth.py``).

Tokens are 32 random bytes (urlsafe base64, prefixed ``gf_``); only their HMAC with the
server's key is stored (``tokenkey.py``), so a token is shown once, when it is created.
A row from before 0008 holds plain sha256: it is accepted and rewritten to the HMAC on
its first use.

Every token expires except the bootstrap admin token (``GPUFLEET_ADMIN_TOKEN``, or the
one printed on the first start): that is the break-glass credential of an empty
database; it may be revoked once another admin token is active, and
``gpufleet admin create-user --role admin --database-url`` (on the database host) makes
a new admin if every admin token lapsed. API tokens live ``--token-ttl`` (90 days) or
less when asked (``POST /v1/tokens {"expires_in": "1h"}``); a web session
(``POST /v1/sessions``: what the fleet page trades the pasted API token for, so the
long-lived token is not kept in the browser) lives ``--session-ttl`` (12 h), never past
the token it came from, and cannot mint tokens or sessions. The last active admin token
(not a session) cannot be revoked.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, and_, or_, select, update
from sqlalchemy.orm import Session

from gpufleet.api.users import TokenCreated, TokenOut
from gpufleet.server.config import Caps
from gpufleet.server.problems import Failure, conflict, forbidden, invalid, not_found
from gpufleet.server.services.auth import Principal, TokenCache, hasher_for, new_token
from gpufleet.server.services.caps import tokens_problem
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import Token, User
from gpufleet.server.store.pages import TokenPage, cut, id_cursor
from gpufleet.server.store.tokenkey import TokenHasher
from gpufleet.timefmt import format_duration, parse_duration

TOKEN_TTL_S = 90 * 86400.0
SESSION_TTL_S = 12 * 3600.0


def add_token(
    s: Session,
    *,
    user: User,
    name: str,
    now: float,
    hasher: TokenHasher,
    expires_at: float | None,
    kind: str = "api",
    token: str | None = None,
) -> TokenCreated:
    token = token or new_token()
    row = Token(
        user_id=user.id,
        name=name,
        token_hash=hasher.digest(token),
        hint=token[-4:],
        created_at=now,
        expires_at=expires_at,
        kind=kind,
    )
    s.add(row)
    s.flush()
    return TokenCreated(
        id=row.id,
        user=user.name,
        name=name,
        hint=row.hint,
        created_at=now,
        revoked=False,
        kind=kind,
        expires_at=expires_at,
        token=token,
    )


def bound_lifetimes(*, db: Database, now: float, ttl_s: float) -> int:
    """Give every API token without an expiry (rows from before 0008) ``ttl_s`` from
    ``now``; the number changed. The server does it at start."""
    with db.write() as s:
        res = s.execute(
            update(Token)
            .where(Token.expires_at.is_(None), Token.kind != "bootstrap")
            .values(expires_at=now + ttl_s)
            .execution_options(synchronize_session=False)
        )
        return int(getattr(res, "rowcount", 0) or 0)


# -- tokens -------------------------------------------------------------------------------------


def _token_out(t: Token, user: str) -> TokenOut:
    return TokenOut(
        id=t.id,
        user=user,
        name=t.name,
        hint=t.hint,
        created_at=t.created_at,
        revoked=t.revoked_at is not None,
        kind=t.kind,
        expires_at=t.expires_at,
    )


def create_token(
    *,
    db: Database,
    actor: Principal,
    name: str,
    user: str | None,
    now: float,
    caps: Caps | None = None,
    hasher: TokenHasher | None = None,
    expires_in: str | float | None = None,
    max_ttl_s: float = TOKEN_TTL_S,
) -> TokenCreated | Failure:
    """``caps``: refuse a token past the owner's cap (``services/caps.py``). It lives
    ``expires_in`` (seconds or a duration; at most, and by default, ``max_ttl_s``:
    ``--token-ttl``)."""
    if actor.session:
        return forbidden("a web session cannot create tokens: use an API token")
    if actor.job is not None:
        return forbidden(f"job {actor.job}'s own credential cannot create tokens: they would outlive it")
    if user is not None and user != actor.name and not actor.is_admin:
        return forbidden("only admins create tokens for other users")
    ttl_s = _lifetime(expires_in, max_ttl_s)
    if isinstance(ttl_s, Failure):
        return ttl_s
    with db.write() as s:
        owner = s.scalar(select(User).where(User.name == (user or actor.name)))
        if owner is None:
            return not_found(f"no user {user}")
        if caps is not None:
            problem = tokens_problem(
                s, caps=caps, user_id=owner.id, name=owner.name, role=owner.role, now=now
            )
            if problem is not None:
                return problem
        return add_token(
            s, user=owner, name=name, now=now, hasher=hasher_for(db, hasher), expires_at=now + ttl_s
        )


def _lifetime(value: str | float | None, max_s: float) -> float | Failure:
    if value is None:
        return max_s
    try:
        secs = float(value) if isinstance(value, int | float) else parse_duration(value)
    except ValueError as exc:
        return invalid(f"expires_in: {exc}")
    if not 0 < secs <= max_s:
        return invalid(
            f"expires_in: a token lives more than 0 s and at most {format_duration(max_s)} (--token-ttl)"
        )
    return secs


def create_session(
    *,
    db: Database,
    actor: Principal,
    now: float,
    hasher: TokenHasher | None = None,
    ttl_s: float = SESSION_TTL_S,
) -> TokenCreated | Failure:
    """A web session for the caller: ``ttl_s`` (``--session-ttl``), never past the
    expiry of the token it is made with."""
    if actor.session:
        return forbidden("a web session cannot start another: sign in with an API token")
    if actor.job is not None:
        return forbidden(f"job {actor.job}'s own credential cannot start a web session")
    expires_at = now + ttl_s if actor.expires_at is None else min(now + ttl_s, actor.expires_at)
    with db.write() as s:
        owner = s.get(User, actor.user_id)
        if owner is None:
            return not_found(f"no user {actor.name}")
        return add_token(
            s,
            user=owner,
            name="web",
            now=now,
            hasher=hasher_for(db, hasher),
            expires_at=expires_at,
            kind="session",
        )


def list_tokens(
    *, db: Database, actor: Principal, user: str | None, limit: int = 100, cursor: str | None = None
) -> TokenPage | Failure:
    """By id: yours, or (admins) everyone's or ``user``'s."""
    if user is not None and user != actor.name and not actor.is_admin:
        return forbidden("only admins list other users' tokens")
    try:
        after_id = id_cursor(cursor)
    except ValueError:
        return invalid(f"cursor: {cursor!r} is not a cursor this list gave")
    with db.read() as s:
        q = select(Token, User.name).join(User, User.id == Token.user_id).order_by(Token.id).limit(limit + 1)
        if user is not None:
            q = q.where(User.name == user)
        elif not actor.is_admin:
            q = q.where(Token.user_id == actor.user_id)
        if after_id is not None:
            q = q.where(Token.id > after_id)
        rows, after = cut([r.tuple() for r in s.execute(q)], limit, lambda r: str(r[0].id))
        return TokenPage(items=[_token_out(t, name) for t, name in rows], next_cursor=after)


def revoke_token(
    *, db: Database, actor: Principal, token_id: int, now: float, cache: TokenCache | None = None
) -> TokenOut | Failure:
    if cache is not None:
        cache.clear()
    with db.write() as s:
        row = s.execute(
            select(Token, User.name).join(User, User.id == Token.user_id).where(Token.id == token_id)
        ).first()
        if row is None or (row[0].user_id != actor.user_id and not actor.is_admin):
            return not_found(f"no token {token_id}")
        tok, owner = row.tuple()
        if tok.revoked_at is None:
            refused = _last_admin_token(s, tok, now=now)
            if refused is not None:
                return refused
            tok.revoked_at = now
        return _token_out(tok, owner)


def _active(now: float) -> ColumnElement[bool]:
    return and_(
        Token.revoked_at.is_(None),
        Token.kind != "session",
        or_(Token.expires_at.is_(None), Token.expires_at > now),
    )


def _last_admin_token(s: Session, tok: Token, *, now: float) -> Failure | None:
    """A conflict when ``tok`` is the last active admin token (revoking it would lock
    every admin out). Revocations of admin tokens are serialised by locking the admin
    users' rows first (PostgreSQL; SQLite's writers are serial already), so two admins
    revoking each other's last tokens at once cannot both succeed."""
    if tok.kind == "session" or (tok.expires_at is not None and tok.expires_at <= now):
        return None
    if s.scalar(select(User.role).where(User.id == tok.user_id)) != "admin":
        return None
    admins = list(s.scalars(select(User.id).where(User.role == "admin").order_by(User.id).with_for_update()))
    other = s.scalar(
        select(Token.id).where(Token.user_id.in_(admins), Token.id != tok.id, _active(now)).limit(1)
    )
    if other is not None:
        return None
    return conflict(
        f"token {tok.id} is the last active admin token: revoking it would lock every admin out; "
        "create another admin token first (gpufleet tokens create)"
    )
