"""``srtf-oracle``: shortest *true* remaining time first, preemptive.

It reads ``JobRequest.oracle_remaining_s``, which only the simulator knows, so it is a
reference bound for the other policies, never a production choice. Remaining work is
weighted by GPUs (smallest remaining GPU-seconds first), the 2D analogue of SRTF.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gpufleet.scheduler.model import JobRequest, RunningJob
from gpufleet.scheduler.policies.base import BackfillMode, Context, Key, Policy


@dataclass(frozen=True, kw_only=True)
class SrtfOraclePolicy(Policy):
    name: ClassVar[str] = "srtf-oracle"
    backfill: ClassVar[BackfillMode] = "greedy"
    preemptive: ClassVar[bool] = True
    uses_oracle: ClassVar[bool] = True

    min_gain: float = 1.5
    """A victim must have this many times the preemptor's remaining work (avoids
    swapping two nearly equal jobs back and forth)."""

    def remaining(self, job: JobRequest, running: RunningJob | None, now: float) -> float:
        left = job.oracle_remaining_s
        if left is None:
            left = self.limit(job)
        if running is not None:
            left -= now - running.started_at
        return max(0.0, left) * job.gpus

    def key(self, job: JobRequest, running: RunningJob | None, ctx: Context) -> Key:
        return (-job.priority, self.remaining(job, running, ctx.now), job.submit_time, job.id)

    def can_preempt(
        self, job: JobRequest, job_key: Key, victim: RunningJob, victim_key: Key, ctx: Context
    ) -> bool:
        if victim_key[0] != job_key[0]:
            return bool(victim_key[0] > job_key[0])
        return bool(victim_key[1] > self.min_gain * job_key[1])
