"""Users, teams, quotas, tokens and pools. Lists answer a page at a time (``pages.py``)."""

from __future__ import annotations

from fastapi import APIRouter

from gpufleet.api.users import (
    DefaultTeamIn,
    MemberIn,
    PoolIn,
    PoolOut,
    PoolPatch,
    QuotaIn,
    TeamIn,
    TeamOut,
    TokenCreated,
    TokenIn,
    TokenOut,
    UserCreated,
    UserIn,
    UserOut,
)
from gpufleet.server.http.deps import Me, PartsDep
from gpufleet.server.problems import ObjectId, unwrap
from gpufleet.server.routers.paging import Cursor, Limit
from gpufleet.server.services import pools, tokens, users
from gpufleet.server.store.pages import PoolPage, TeamPage, TokenPage, UserPage

router = APIRouter()


@router.get("/users/me", response_model=UserOut, tags=["users"])
def whoami(parts: PartsDep, me: Me) -> UserOut:
    return users.whoami(db=parts.db, actor=me)


@router.get("/users", response_model=UserPage, tags=["users"])
def list_users(parts: PartsDep, me: Me, limit: Limit = 100, cursor: Cursor = None) -> UserPage:
    return unwrap(users.list_users(db=parts.db, actor=me, limit=limit, cursor=cursor))


@router.post("/users", status_code=201, response_model=UserCreated, tags=["users"])
def create_user(spec: UserIn, parts: PartsDep, me: Me) -> UserCreated:
    made = users.create_user(
        db=parts.db, actor=me, spec=spec, now=parts.now(), hasher=parts.hasher, ttl_s=parts.config.token_ttl_s
    )
    return unwrap(made)


@router.put("/users/{name}/default-team", response_model=UserOut, tags=["users"])
def set_default_team(name: str, spec: DefaultTeamIn, parts: PartsDep, me: Me) -> UserOut:
    """Set the team a user's jobs are charged to when a submission names none: one's
    own (any of one's teams), or anyone's for an admin."""
    return unwrap(users.set_default_team(db=parts.db, actor=me, user=name, team=spec.team))


@router.get("/teams", response_model=TeamPage, tags=["teams"])
def list_teams(parts: PartsDep, me: Me, limit: Limit = 100, cursor: Cursor = None) -> TeamPage:
    return users.list_teams(db=parts.db, actor=me, now=parts.now(), limit=limit, cursor=cursor)


@router.post("/teams", status_code=201, response_model=TeamOut, tags=["teams"])
def create_team(spec: TeamIn, parts: PartsDep, me: Me) -> TeamOut:
    return unwrap(users.create_team(db=parts.db, actor=me, name=spec.name))


@router.get("/teams/{name}", response_model=TeamOut, tags=["teams"])
def get_team(name: str, parts: PartsDep, me: Me) -> TeamOut:
    return unwrap(users.get_team(db=parts.db, actor=me, name=name, now=parts.now()))


@router.post("/teams/{name}/members", response_model=TeamOut, tags=["teams"])
def add_member(name: str, spec: MemberIn, parts: PartsDep, me: Me) -> TeamOut:
    return unwrap(users.add_member(db=parts.db, actor=me, team=name, user=spec.user))


@router.put("/teams/{name}/quota", response_model=TeamOut, tags=["teams"])
def set_quota(name: str, spec: QuotaIn, parts: PartsDep, me: Me) -> TeamOut:
    return unwrap(users.set_quota(db=parts.db, actor=me, team=name, quota=spec))


@router.get("/tokens", response_model=TokenPage, tags=["tokens"])
def list_tokens(
    parts: PartsDep, me: Me, user: str | None = None, limit: Limit = 100, cursor: Cursor = None
) -> TokenPage:
    return unwrap(tokens.list_tokens(db=parts.db, actor=me, user=user, limit=limit, cursor=cursor))


@router.post("/tokens", status_code=201, response_model=TokenCreated, tags=["tokens"])
def create_token(spec: TokenIn, parts: PartsDep, me: Me) -> TokenCreated:
    return unwrap(
        tokens.create_token(
            db=parts.db,
            actor=me,
            name=spec.name,
            user=spec.user,
            now=parts.now(),
            caps=parts.config.caps,
            hasher=parts.hasher,
            expires_in=spec.expires_in,
            max_ttl_s=parts.config.token_ttl_s,
        )
    )


@router.delete("/tokens/{token_id}", response_model=TokenOut, tags=["tokens"])
def revoke_token(token_id: ObjectId, parts: PartsDep, me: Me) -> TokenOut:
    return unwrap(
        tokens.revoke_token(db=parts.db, actor=me, token_id=token_id, now=parts.now(), cache=parts.tokens)
    )


@router.get("/pools", response_model=PoolPage, tags=["pools"])
def list_pools(parts: PartsDep, me: Me, limit: Limit = 100, cursor: Cursor = None) -> PoolPage:
    return pools.list_pools(db=parts.db, actor=me, limit=limit, cursor=cursor)


@router.post("/pools", status_code=201, response_model=PoolOut, tags=["pools"])
def create_pool(spec: PoolIn, parts: PartsDep, me: Me) -> PoolOut:
    return unwrap(pools.create_pool(db=parts.db, actor=me, spec=spec))


@router.get("/pools/{name}", response_model=PoolOut, tags=["pools"])
def get_pool(name: str, parts: PartsDep, me: Me) -> PoolOut:
    return unwrap(pools.get_pool(db=parts.db, actor=me, name=name))


@router.patch("/pools/{name}", response_model=PoolOut, tags=["pools"])
def update_pool(name: str, spec: PoolPatch, parts: PartsDep, me: Me) -> PoolOut:
    return unwrap(pools.update_pool(db=parts.db, actor=me, name=name, patch=spec))


@router.delete("/pools/{name}", response_model=PoolOut, tags=["pools"])
def delete_pool(name: str, parts: PartsDep, me: Me) -> PoolOut:
    return unwrap(pools.delete_pool(db=parts.db, actor=me, name=name))
