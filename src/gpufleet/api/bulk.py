"""Changes to many jobs at once (``scontrol hold|release|update`` on a whole array, a
user's jobs, a name): ``POST /v1/jobs/hold``, ``/release`` and ``/update``. Each matches
jobs as ``POST /v1/jobs/cancel`` does (``CancelMany``: every field given, among the
caller's own jobs, an operator's: anyone's) and is one statement on the database for
the jobs it moves, whatever their number."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from gpufleet.api.base import INT32, Id, Name, Reply, Request
from gpufleet.api.jobs import JobUpdate


class JobMatch(Request):
    """Which jobs: all that match every field given (at least one)."""

    ids: list[Id] | None = Field(default=None, max_length=10_000, description="these jobs")
    array: int | None = Field(default=None, ge=1, le=INT32, description="every task of this array")
    user: Name | None = Field(default=None, description="operators: this user's jobs")
    states: list[str] | None = Field(default=None, max_length=16, description="only in these states")
    name: Annotated[str, StringConstraints(min_length=1, max_length=128)] | None = None


class JobsUpdate(JobMatch):
    """``POST /v1/jobs/update``: ``set`` (a time limit, a name, held) on every job matched."""

    set: JobUpdate


class JobsChanged(Reply):
    changed: list[int] = Field(description="the jobs changed, in id order")
    skipped: list[int] = Field(
        description="matched but not changed: ended, not in a state it applies to, or changing too fast"
    )
