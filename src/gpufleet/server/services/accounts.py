"""Users, teams, team quotas and API tokens (who is calling: ``services/auth.py``).

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

from collections.abc import Callable

from sqlalchemy import ColumnElement, and_, or_, select, update
from sqlalchemy.orm import Session

from gpufleet.server import accounting
from gpufleet.server.db import Database
from gpufleet.server.models import Membership, Team, Token, User
from gpufleet.server.pages import TeamPage, TokenPage, UserPage, cut, id_cursor
from gpufleet.server.problems import Failure, conflict, forbidden, invalid, not_found
from gpufleet.server.schemas import (
    QuotaIn,
    Role,
    TeamOut,
    TokenCreated,
    TokenOut,
    UserCreated,
    UserIn,
    UserOut,
)

# Who is calling lives in ``auth.py``; these names were defined here and are re-exported.
from gpufleet.server.services.auth import Principal as Principal
from gpufleet.server.services.auth import Refused as Refused
from gpufleet.server.services.auth import TokenCache as TokenCache
from gpufleet.server.services.auth import authenticate as authenticate
from gpufleet.server.services.auth import check_token as check_token
from gpufleet.server.services.auth import hash_token as hash_token
from gpufleet.server.services.auth import hasher_for, new_token
from gpufleet.server.services.caps import Caps, tokens_problem
from gpufleet.server.tokenkey import TokenHasher
from gpufleet.timefmt import format_duration, parse_duration

ROLES: tuple[Role, ...] = ("admin", "operator", "user")
TOKEN_TTL_S = 90 * 86400.0
SESSION_TTL_S = 12 * 3600.0


def _add_token(
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


def bootstrap_admin(
    *, db: Database, now: float, token: str | None, hasher: TokenHasher | None = None
) -> str | None:
    """On an empty database create the ``admin`` user, member of team ``default`` (their
    default team: like Slurm's root account, so the first admin can submit at once), with
    the bootstrap token (kind
    ``bootstrap``, no expiry: the module docstring says why). Returns the new token when
    one was generated (the caller prints it once), None when users already exist or
    ``token`` was given (GPUFLEET_ADMIN_TOKEN)."""
    with db.write() as s:
        if s.execute(select(User.id).limit(1)).first() is not None:
            return None
        admin = User(name="admin", role="admin", created_at=now)
        s.add(admin)
        team = s.scalar(select(Team).where(Team.name == DEFAULT_TEAM))
        if team is None:
            team = Team(name=DEFAULT_TEAM)
            s.add(team)
        s.flush()
        _join(s, admin.id, team.id)
        created = _add_token(
            s,
            user=admin,
            name="bootstrap",
            now=now,
            hasher=hasher_for(db, hasher),
            expires_at=None,
            kind="bootstrap",
            token=token,
        )
    return None if token else created.token


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


# -- users and teams --------------------------------------------------------------------------


_MEMBER_OF = select(Membership.user_id, Team.name, Membership.is_default).join(
    Team, Team.id == Membership.team_id
)


def _users_out(s: Session, users: list[User]) -> list[UserOut]:
    teams: dict[int, list[str]] = {}
    default: dict[int, str] = {}
    for uid, team, is_default in s.execute(_MEMBER_OF.where(Membership.user_id.in_([u.id for u in users]))):
        teams.setdefault(uid, []).append(team)
        if is_default:
            default[uid] = team
    return [
        UserOut(
            id=u.id,
            name=u.name,
            role=u.role,  # type: ignore[arg-type]
            teams=sorted(teams.get(u.id, [])),
            default_team=default.get(u.id),
        )
        for u in users
    ]


def _user_out(s: Session, u: User) -> UserOut:
    return _users_out(s, [u])[0]


def _join(s: Session, user_id: int, team_id: int) -> None:
    """Make the user a member; their first team becomes their default (Slurm sets a
    user's DefaultAccount with their first association)."""
    if s.get(Membership, (user_id, team_id)) is not None:
        return
    has_default = s.scalar(
        select(Membership.team_id).where(Membership.user_id == user_id, Membership.is_default).limit(1)
    )
    s.add(Membership(user_id=user_id, team_id=team_id, is_default=has_default is None))
    s.flush()


DEFAULT_TEAM = "default"
"""The first admin's team, created with them, so that they can submit at once."""


def create_user(
    *,
    db: Database,
    actor: Principal,
    spec: UserIn,
    now: float,
    hasher: TokenHasher | None = None,
    ttl_s: float = TOKEN_TTL_S,
) -> UserCreated | Failure:
    """The user and their first API token (``ttl_s``)."""
    if not actor.is_admin:
        return forbidden("only admins create users")
    with db.write() as s:
        if s.scalar(select(User.id).where(User.name == spec.name)) is not None:
            return conflict(f"user {spec.name} exists")
        teams = {t.name: t for t in s.scalars(select(Team).where(Team.name.in_(spec.teams)))}
        missing = sorted(set(spec.teams) - set(teams))
        if missing:
            return invalid(f"unknown team {', '.join(missing)} (create it first)")
        user = User(name=spec.name, role=spec.role, created_at=now)
        s.add(user)
        s.flush()
        for name in dict.fromkeys(spec.teams):  # as listed: the first is the default team
            _join(s, user.id, teams[name].id)
        tok = _add_token(
            s, user=user, name="initial", now=now, hasher=hasher_for(db, hasher), expires_at=now + ttl_s
        )
        return UserCreated(**_user_out(s, user).model_dump(), token=tok.token)


def list_users(
    *, db: Database, actor: Principal, limit: int = 100, cursor: str | None = None
) -> UserPage | Failure:
    """By name; a plain user sees only themselves."""
    with db.read() as s:
        if not actor.is_operator:
            me = s.get(User, actor.user_id)
            assert me is not None
            return UserPage(items=[_user_out(s, me)], next_cursor=None)
        q = select(User).order_by(User.name).limit(limit + 1)
        if cursor is not None:
            q = q.where(User.name > cursor)
        users, after = cut(list(s.scalars(q)), limit, lambda u: u.name)
        return UserPage(items=_users_out(s, users), next_cursor=after)


def whoami(*, db: Database, actor: Principal) -> UserOut:
    with db.read() as s:
        me = s.get(User, actor.user_id)
        assert me is not None
        return _user_out(s, me)


def team_out(s: Session, t: Team, *, now: float | None = None, finances: bool = True) -> TeamOut:
    """With ``now`` and a budget set, also what the team spent this month. Without
    ``finances`` (a user who is not in the team) budgets and spend are left out: names,
    members and quotas are public, as in ``sacctmgr show assoc``; money is not."""
    q = select(User.name).join(Membership, Membership.user_id == User.id).where(Membership.team_id == t.id)
    spent = None
    if finances and now is not None and (t.budget_soft is not None or t.budget_hard is not None):
        spent = round(accounting.month_spend(s, now, [t.id]).get(t.id, 0.0), 4)
    return TeamOut(
        name=t.name,
        members=sorted(s.scalars(q)),
        quota_gpus=t.quota_gpus,
        quota_limit=t.quota_limit,
        budget_soft=t.budget_soft if finances else None,
        budget_hard=t.budget_hard if finances else None,
        month_cost=spent,
    )


def _sees_finances(s: Session, actor: Principal) -> Callable[[Team], bool]:
    """Operators and admins see every team's budget and spend; a user only their own."""
    if actor.is_operator:
        return lambda _: True
    mine = set(s.scalars(select(Membership.team_id).where(Membership.user_id == actor.user_id)))
    return lambda t: t.id in mine


def create_team(*, db: Database, actor: Principal, name: str) -> TeamOut | Failure:
    if not actor.is_admin:
        return forbidden("only admins create teams")
    with db.write() as s:
        if s.scalar(select(Team.id).where(Team.name == name)) is not None:
            return conflict(f"team {name} exists")
        team = Team(name=name)
        s.add(team)
        s.flush()
        return team_out(s, team)


def list_teams(
    *, db: Database, actor: Principal, now: float | None = None, limit: int = 100, cursor: str | None = None
) -> TeamPage:
    """By name, everyone's (names, members and quotas are public; money is not)."""
    with db.read() as s:
        sees = _sees_finances(s, actor)
        q = select(Team).order_by(Team.name).limit(limit + 1)
        if cursor is not None:
            q = q.where(Team.name > cursor)
        teams, after = cut(list(s.scalars(q)), limit, lambda t: t.name)
        return TeamPage(items=[team_out(s, t, now=now, finances=sees(t)) for t in teams], next_cursor=after)


def get_team(*, db: Database, actor: Principal, name: str, now: float | None = None) -> TeamOut | Failure:
    with db.read() as s:
        team = s.scalar(select(Team).where(Team.name == name))
        if team is None:
            return not_found(f"no team {name}")
        return team_out(s, team, now=now, finances=_sees_finances(s, actor)(team))


def add_member(*, db: Database, actor: Principal, team: str, user: str) -> TeamOut | Failure:
    if not actor.is_admin:
        return forbidden("only admins change team membership")
    with db.write() as s:
        t = s.scalar(select(Team).where(Team.name == team))
        u = s.scalar(select(User).where(User.name == user))
        if t is None or u is None:
            return not_found(f"no team {team}" if t is None else f"no user {user}")
        _join(s, u.id, t.id)
        return team_out(s, t)


def set_default_team(*, db: Database, actor: Principal, user: str, team: str) -> UserOut | Failure:
    """A user sets their own default team (an admin anyone's); it must be one of theirs."""
    if user != actor.name and not actor.is_admin:
        return forbidden("only admins set another user's default team")
    with db.write() as s:
        u = s.scalar(select(User).where(User.name == user))
        if u is None:
            return not_found(f"no user {user}")
        t = s.scalar(select(Team).where(Team.name == team))
        m = s.get(Membership, (u.id, t.id)) if t is not None else None
        if t is None or m is None:
            theirs = ", ".join(_user_out(s, u).teams) or "none"
            return invalid(f"team: {user} is not a member of team {team} (their teams: {theirs})")
        s.execute(
            update(Membership)
            .where(Membership.user_id == u.id, Membership.team_id != t.id)
            .values(is_default=False)
            .execution_options(synchronize_session=False)
        )
        m.is_default = True
        s.flush()
        return _user_out(s, u)


def set_quota(*, db: Database, actor: Principal, team: str, quota: QuotaIn) -> TeamOut | Failure:
    if not actor.is_admin:
        return forbidden("only admins set quotas")
    if quota.limit is not None and quota.limit < quota.gpus:
        return invalid(f"limit {quota.limit} is below the nominal {quota.gpus} GPUs")
    with db.write() as s:
        t = s.scalar(select(Team).where(Team.name == team))
        if t is None:
            return not_found(f"no team {team}")
        t.quota_gpus, t.quota_limit = quota.gpus, quota.limit
        s.flush()
        return team_out(s, t)


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
        return _add_token(
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
    expires_at = now + ttl_s if actor.expires_at is None else min(now + ttl_s, actor.expires_at)
    with db.write() as s:
        owner = s.get(User, actor.user_id)
        if owner is None:
            return not_found(f"no user {actor.name}")
        return _add_token(
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
