"""Slurm's QOS (``gpufleet admin qos``): a priority, per-user limits, preemptability."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from gpufleet.api.base import Name, Reply, Request


class QosIn(Request):
    name: Name
    priority: int = Field(default=0, ge=-1000, le=1000, description="added to its jobs' priority")
    max_gpus_per_user: int | None = Field(
        default=None, ge=0, le=100_000, description="GPUs one user's running jobs of it may hold (null: any)"
    )
    max_jobs_per_user: int | None = Field(
        default=None, ge=0, le=1_000_000, description="jobs of it one user may run at once (null: any)"
    )
    preemptable: bool = Field(default=True, description="false: its jobs are never preempted")
    default: bool = Field(default=False, description="jobs without --qos get it (one at most)")
    description: Annotated[str, StringConstraints(max_length=256)] = ""


class QosOut(Reply):
    name: str
    priority: int
    max_gpus_per_user: int | None
    max_jobs_per_user: int | None
    preemptable: bool
    default: bool
    description: str


class QosList(Reply):
    items: list[QosOut]
