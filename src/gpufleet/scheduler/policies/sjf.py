"""``sjf``: shortest requested time limit first (jobs without one count as
``default_time_limit_s``), greedy: any job that fits starts. Not preemptive. Wide or
long jobs can starve under load; it is here as a classic point of comparison."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gpufleet.scheduler.model import JobRequest, RunningJob
from gpufleet.scheduler.policies.base import BackfillMode, Context, Key, Policy


@dataclass(frozen=True, kw_only=True)
class SjfPolicy(Policy):
    name: ClassVar[str] = "sjf"
    backfill: ClassVar[BackfillMode] = "greedy"

    def key(self, job: JobRequest, running: RunningJob | None, ctx: Context) -> Key:
        return (-job.priority, self.limit(job), job.submit_time, job.id)
