"""``las``: Tiresias' discretised two-dimensional least-attained-service (NSDI'19).

A job's attained service is GPUs x seconds run so far; no duration knowledge is
needed. Service thresholds split jobs into queues (fewer service -> higher queue);
inside a queue jobs keep FIFO order by submit time. A waiting job preempts running jobs
of lower queues. Tiresias' starvation knob: a job that waited ``starve_factor`` times
as long as it has run (and at least ``starve_min_s``) is promoted to the top queue.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import ClassVar

from gpufleet.scheduler.model import JobRequest, RunningJob
from gpufleet.scheduler.policies.base import BackfillMode, Context, Key, Policy


def service_queue(attained_gpu_s: float, thresholds: tuple[float, ...]) -> int:
    """Index of the queue for ``attained_gpu_s`` (0 = highest priority)."""
    return bisect.bisect_right(thresholds, attained_gpu_s)


def attained(job: JobRequest, running: RunningJob | None, now: float) -> float:
    return running.attained_service_s(now) if running is not None else job.attained_service_s


def executed(job: JobRequest, running: RunningJob | None, now: float) -> float:
    return running.executed_s(now) if running is not None else job.executed_s


@dataclass(frozen=True, kw_only=True)
class LasPolicy(Policy):
    name: ClassVar[str] = "las"
    backfill: ClassVar[BackfillMode] = "greedy"
    preemptive: ClassVar[bool] = True
    victim_class: ClassVar[int] = 2  # (priority, queue): then least lost work

    thresholds_gpu_s: tuple[float, ...] = (3_600.0, 36_000.0)
    starve_factor: float = 0.0  # 0 disables promotion (Tiresias' default build)
    starve_min_s: float = 3_600.0

    @property
    def static_pending_keys(self) -> bool:
        return self.starve_factor <= 0  # promotion depends on the clock

    def starving(self, job: JobRequest, running: RunningJob | None, now: float) -> bool:
        if running is not None or self.starve_factor <= 0:
            return False
        waited = now - job.queued_since
        return waited >= max(self.starve_min_s, self.starve_factor * job.executed_s)

    def key(self, job: JobRequest, running: RunningJob | None, ctx: Context) -> Key:
        queue = (
            0
            if self.starving(job, running, ctx.now)
            else 1 + service_queue(attained(job, running, ctx.now), self.thresholds_gpu_s)
        )
        return (-job.priority, queue, job.submit_time, job.id)

    def running_key(self, running: RunningJob, ctx: Context) -> tuple[Key, float]:
        """``key``, valid until the job's attained service reaches the next threshold
        (running jobs never starve, so nothing else moves them)."""
        key = self.key(running.job, running, ctx)
        if type(self).key is not LasPolicy.key:
            return key, -math.inf  # a subclass keys on something else
        queue = key[1] - 1
        gpus = running.job.gpu_weight
        if queue >= len(self.thresholds_gpu_s) or gpus <= 0:
            return key, math.inf
        crossing = running.started_at + (self.thresholds_gpu_s[queue] - running.job.attained_service_s) / gpus
        return key, crossing - 1e-3  # clear of the boundary, where rounding could tip it

    def victim_floor(self, job_key: Key) -> Key:
        """Jobs of lower (priority, queue) only: what ``can_preempt`` allows, and a split
        between rank classes (``victim_class``)."""
        return (job_key[0], job_key[1], math.inf)

    def can_preempt(
        self, job: JobRequest, job_key: Key, victim: RunningJob, victim_key: Key, ctx: Context
    ) -> bool:
        # Only a strictly better (priority, queue) may preempt: FIFO inside a queue.
        return victim_key[:2] > job_key[:2]
