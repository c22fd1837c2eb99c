"""Pools, users, teams, quotas, budgets, API tokens; the health probes' body."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    Field,
    StringConstraints,
)

from gpufleet.api.base import Label, Name, Reply, Request, Role


class PoolIn(Request):
    name: Name
    gpu: bool = Field(default=True, description="false: a CPU-only pool, for 0-GPU jobs")
    description: Annotated[str, StringConstraints(max_length=256)] = ""
    default: bool = Field(
        default=False, description="jobs that name no pool go here (Slurm's Default=YES; one pool at most)"
    )


class PoolPatch(Request):
    description: Annotated[str, StringConstraints(max_length=256)] | None = None
    default: bool | None = Field(
        default=None, description="true: make it the default pool (the previous one stops being it)"
    )


class PoolOut(Reply):
    name: str
    gpu: bool
    description: str
    nodes: int
    default: bool = False


class UserIn(Request):
    name: Name
    role: Role = "user"
    teams: list[Name] = Field(default_factory=list, max_length=64)


class UserOut(Reply):
    id: int
    name: str
    role: Role
    teams: list[str]
    default_team: str | None = Field(
        default=None,
        description="the team a job is charged to when its submission names none (Slurm's DefaultAccount)",
    )


class DefaultTeamIn(Request):
    team: Name


class UserCreated(UserOut):
    token: str = Field(description="shown only once")


class TeamIn(Request):
    name: Name


class MemberIn(Request):
    user: Name


class QuotaIn(Request):
    gpus: int = Field(ge=0, le=1_000_000)
    limit: int | None = Field(default=None, ge=0, le=1_000_000)


class TeamOut(Reply):
    name: str
    members: list[str] = Field(description="who is in it: shown to its members, operators and admins only")
    quota_gpus: int | None
    quota_limit: int | None
    budget_soft: float | None = None
    budget_hard: float | None = None
    month_cost: float | None = Field(default=None, description="spent this month (with a budget set)")


class BudgetIn(Request):
    soft: float | None = Field(default=None, ge=0, description="monthly spend that warns; null: none")
    hard: float | None = Field(
        default=None, ge=0, description="monthly spend that holds new jobs; null: none"
    )


class TokenIn(Request):
    name: Annotated[Label, StringConstraints(min_length=1, max_length=64)] = "cli"
    user: Name | None = Field(default=None, description="admins only: create for another user")
    expires_in: str | float | None = Field(
        default=None,
        description="lifetime: seconds, or a duration such as 1h or 30d; at most (and by default) "
        "the server's --token-ttl",
    )


class TokenOut(Reply):
    id: int
    user: str
    name: str
    hint: str
    created_at: float
    revoked: bool
    kind: str = Field(default="api", description="api, session (a web sign-in) or bootstrap")
    expires_at: float | None = Field(default=None, description="null: never (the bootstrap token)")


class TokenCreated(TokenOut):
    token: str = Field(description="shown only once")


class Health(Reply):
    status: str
    detail: str = ""
