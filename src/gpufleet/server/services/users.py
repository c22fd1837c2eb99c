"""Users, teams, memberships (each user's default team) and team quotas. A new user
gets a first API token (``services/tokens.py``); the first start of an empty database
creates the ``admin`` user (``bootstrap_admin``)."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpufleet.api.base import Role
from gpufleet.api.users import QuotaIn, TeamOut, UserCreated, UserIn, UserOut
from gpufleet.server.problems import Failure, conflict, forbidden, invalid, not_found
from gpufleet.server.services.auth import Principal, hasher_for
from gpufleet.server.services.tokens import TOKEN_TTL_S, add_token
from gpufleet.server.store import effects, ledger
from gpufleet.server.store.db import Database
from gpufleet.server.store.models import Membership, Team, User
from gpufleet.server.store.pages import TeamPage, UserPage, cut
from gpufleet.server.store.tokenkey import TokenHasher

ROLES: tuple[Role, ...] = ("admin", "operator", "user")


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
        created = add_token(
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
        tok = add_token(
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
    ``finances`` (a user who is not in the team) members, budgets and spend are left
    out: a team's name and quotas are public (a user picks a team and sees why a job
    waits); who is in it is its members' business, and operators' (issue 29), and money
    is not public either. (Slurm's ``sacctmgr show assoc`` shows every association;
    ``PrivateData=users`` is the Slurm setting this follows.)"""
    q = select(User.name).join(Membership, Membership.user_id == User.id).where(Membership.team_id == t.id)
    spent = None
    if finances and now is not None and (t.budget_soft is not None or t.budget_hard is not None):
        spent = round(ledger.month_spend(s, now, [t.id]).get(t.id, 0.0), 4)
    return TeamOut(
        name=t.name,
        members=sorted(s.scalars(q)) if finances else [],
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
    """By name, everyone's (names and quotas are public; members and money are not:
    ``team_out``)."""
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
        effects.wake_scheduler(s)  # what the quota held back may start (or be preempted)
        return team_out(s, t)
