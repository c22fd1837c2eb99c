"""Users, teams, team quotas and API tokens; authentication of a bearer token.

Tokens are 32 random bytes (urlsafe base64, prefixed ``gf_``); only their sha256 is
stored, so a token is shown once, when it is created.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.server import accounting
from gpufleet.server.db import Database
from gpufleet.server.models import Membership, Team, Token, User
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

ROLES: tuple[Role, ...] = ("admin", "operator", "user")


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    """Who is calling: the user behind a valid token."""

    user_id: int
    name: str
    role: Role

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def is_operator(self) -> bool:
        """Operators and admins see and act on every job and node."""
        return self.role in ("admin", "operator")


def new_token() -> str:
    return "gf_" + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(slots=True)
class TokenCache:
    """Recently authenticated tokens, for ``ttl_s`` seconds: most requests then need no
    lookup. A revocation clears it in this process; another server process notices it
    within ``ttl_s``."""

    ttl_s: float = 5.0
    _hits: dict[str, tuple[float, Principal]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, digest: str) -> Principal | None:
        with self._lock:
            hit = self._hits.get(digest)
        return hit[1] if hit is not None and hit[0] > time.monotonic() else None

    def put(self, digest: str, who: Principal) -> None:
        with self._lock:
            if len(self._hits) > 10_000:
                self._hits.clear()
            self._hits[digest] = (time.monotonic() + self.ttl_s, who)

    def clear(self) -> None:
        with self._lock:
            self._hits.clear()


def authenticate(*, db: Database, token: str, cache: TokenCache | None = None) -> Principal | None:
    digest = hash_token(token)
    if cache is not None and (who := cache.get(digest)) is not None:
        return who
    with db.read() as s:
        row = s.execute(
            select(User.id, User.name, User.role)
            .join(Token, Token.user_id == User.id)
            .where(Token.token_hash == digest, Token.revoked_at.is_(None))
        ).first()
    if row is None:
        return None
    who = Principal(user_id=row.id, name=row.name, role=row.role)
    if cache is not None:
        cache.put(digest, who)
    return who


def _add_token(s: Session, *, user: User, name: str, now: float, token: str | None = None) -> TokenCreated:
    token = token or new_token()
    row = Token(user_id=user.id, name=name, token_hash=hash_token(token), hint=token[-4:], created_at=now)
    s.add(row)
    s.flush()
    return TokenCreated(
        id=row.id, user=user.name, name=name, hint=row.hint, created_at=now, revoked=False, token=token
    )


def bootstrap_admin(*, db: Database, now: float, token: str | None) -> str | None:
    """On an empty database create the ``admin`` user. Returns the new token when one was
    generated (the caller prints it once), None when users already exist or ``token`` was
    given (GPUFLEET_ADMIN_TOKEN)."""
    with db.write() as s:
        if s.execute(select(User.id).limit(1)).first() is not None:
            return None
        admin = User(name="admin", role="admin", created_at=now)
        s.add(admin)
        s.flush()
        created = _add_token(s, user=admin, name="bootstrap", now=now, token=token)
    return None if token else created.token


# -- users and teams --------------------------------------------------------------------------


def _teams_of(s: Session, user_id: int) -> list[str]:
    q = select(Team.name).join(Membership, Membership.team_id == Team.id).where(Membership.user_id == user_id)
    return sorted(s.scalars(q))


def _user_out(s: Session, u: User) -> UserOut:
    return UserOut(id=u.id, name=u.name, role=u.role, teams=_teams_of(s, u.id))  # type: ignore[arg-type]


def create_user(*, db: Database, actor: Principal, spec: UserIn, now: float) -> UserCreated | Failure:
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
        for t in teams.values():
            s.add(Membership(user_id=user.id, team_id=t.id))
        tok = _add_token(s, user=user, name="initial", now=now)
        return UserCreated(id=user.id, name=user.name, role=spec.role, teams=sorted(teams), token=tok.token)


def list_users(*, db: Database, actor: Principal) -> list[UserOut] | Failure:
    with db.read() as s:
        if not actor.is_operator:
            me = s.get(User, actor.user_id)
            assert me is not None
            return [_user_out(s, me)]
        return [_user_out(s, u) for u in s.scalars(select(User).order_by(User.name))]


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


def list_teams(*, db: Database, actor: Principal, now: float | None = None) -> list[TeamOut]:
    with db.read() as s:
        sees = _sees_finances(s, actor)
        teams = s.scalars(select(Team).order_by(Team.name))
        return [team_out(s, t, now=now, finances=sees(t)) for t in teams]


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
        if s.get(Membership, (u.id, t.id)) is None:
            s.add(Membership(user_id=u.id, team_id=t.id))
            s.flush()
        return team_out(s, t)


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
    )


def create_token(
    *, db: Database, actor: Principal, name: str, user: str | None, now: float
) -> TokenCreated | Failure:
    if user is not None and user != actor.name and not actor.is_admin:
        return forbidden("only admins create tokens for other users")
    with db.write() as s:
        owner = s.scalar(select(User).where(User.name == (user or actor.name)))
        if owner is None:
            return not_found(f"no user {user}")
        return _add_token(s, user=owner, name=name, now=now)


def list_tokens(*, db: Database, actor: Principal, user: str | None) -> list[TokenOut] | Failure:
    if user is not None and user != actor.name and not actor.is_admin:
        return forbidden("only admins list other users' tokens")
    with db.read() as s:
        q = select(Token, User.name).join(User, User.id == Token.user_id).order_by(Token.id)
        if user is not None:
            q = q.where(User.name == user)
        elif not actor.is_admin:
            q = q.where(Token.user_id == actor.user_id)
        return [_token_out(t, name) for t, name in s.execute(q)]


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
            tok.revoked_at = now
        return _token_out(tok, owner)
