"""``default``: gpufleet's production policy.

Design, and why:

* **Least attained service, finely discretised.** Nobody knows how long a training job
  will run (users' time limits are padded, traces have none), but GPU job durations are
  heavy-tailed: a job that has already run long will probably run long still. So the
  job with the least attained service (GPUs x seconds, 2D as in Tiresias) goes first.
  Service levels grow geometrically (x``level_growth`` from ``first_level_gpu_s``), so
  short jobs overtake early and long jobs are not reshuffled for small differences.
* **Requested time as a tie-breaker, never as a promise.** Inside one level, a job that
  asked for less remaining time goes first (SJF on honest information the user gave);
  jobs without a limit keep FIFO order.
* **Preemption with hysteresis.** A waiting job preempts only jobs at least
  ``preempt_gap`` levels below it that have run ``min_run_s`` in their current attempt,
  so restart/checkpoint overhead stays small and two similar jobs never ping-pong.
* **No starvation.** A job waiting longer than ``starve_factor`` x the time it has
  already run (and at least ``starve_min_s``) jumps to the front, so queueing delay is
  bounded by roughly the starve threshold plus one drain of the fleet.
* **Greedy fill.** Anything that fits starts; with preemption available, holding GPUs
  idle for a blocked wide job (as EASY backfill does) only costs utilisation: once it
  is starving, the wide job preempts what it needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from gpufleet.scheduler.model import JobRequest, RunningJob
from gpufleet.scheduler.policies.base import BackfillMode, Context, Key, Policy
from gpufleet.scheduler.policies.las import attained, executed


@dataclass(frozen=True, kw_only=True)
class DefaultPolicy(Policy):
    name: ClassVar[str] = "default"
    backfill: ClassVar[BackfillMode] = "greedy"
    preemptive: ClassVar[bool] = True

    first_level_gpu_s: float = 1_800.0
    level_growth: float = 4.0
    max_level: int = 8
    preempt_gap: int = 1
    min_run_s: float = 600.0
    starve_factor: float = 4.0
    starve_min_s: float = 6 * 3600.0
    fresh_job_s: float = 1_800.0
    use_limits: bool = True
    width_aware: bool = True

    def expected_remaining(self, job: JobRequest, running: RunningJob | None, now: float) -> float:
        """GPU-seconds the job probably still needs. With a time limit: what is left of
        it (users pad limits, but short limits still mean short jobs). Without: its
        attained service (heavy tails: a job tends to run as long again as it already
        has), but never less than a typical fresh job of its width."""
        if self.use_limits and job.time_limit_s is not None:
            return max(0.0, job.time_limit_s - executed(job, running, now)) * job.gpus
        got = attained(job, running, now)
        return max(got, job.gpus * self.fresh_job_s) if self.width_aware else got

    def level(self, service_gpu_s: float) -> int:
        if service_gpu_s < self.first_level_gpu_s:
            return 0
        n = 1 + int(math.log(service_gpu_s / self.first_level_gpu_s, self.level_growth))
        return min(n, self.max_level)

    def key(self, job: JobRequest, running: RunningJob | None, ctx: Context) -> Key:
        now = ctx.now
        starving = 0
        if running is None:
            waited = now - job.queued_since
            if waited >= max(self.starve_min_s, self.starve_factor * job.executed_s):
                starving = -1
        level = self.level(self.expected_remaining(job, running, now))
        return (-job.priority, starving, level, job.submit_time, job.id)

    def can_preempt(
        self, job: JobRequest, job_key: Key, victim: RunningJob, victim_key: Key, ctx: Context
    ) -> bool:
        if victim_key[:2] != job_key[:2]:
            return bool(victim_key[:2] > job_key[:2])
        if ctx.now - victim.started_at < self.min_run_s:
            return False
        return bool(victim_key[2] >= job_key[2] + self.preempt_gap)
