"""``default``: gpufleet's production policy.

Design, and why:

* **Shortest predicted remaining GPU-time where history knows the job.** A job whose
  run time was predicted confidently from the jobs like it that ended before
  (``JobRequest.predicted_s``, ``scheduler/predict.py``; Helios' QSSF, Lucid) ranks by
  what it probably still needs: (predicted - executed) x GPUs. That is SRTF on a guess,
  and what lets a long wide job run to its end instead of sinking 8x faster than 1-GPU
  jobs, as it does on attained service alone.
* **Least attained service, finely discretised, where it does not.** Nobody knows how
  long a job without history (or one that outran its prediction) will run, but GPU job
  durations are heavy-tailed: a job that has already run long will probably run long
  still. So such a job ranks by its attained service (GPUs x seconds, 2D as in
  Tiresias). Service levels grow geometrically (x``level_growth`` from
  ``first_level_gpu_s``), so short jobs overtake early and long jobs are not reshuffled
  for small differences.
* **Requested time as a hint, never as a promise.** Without a confident prediction, a
  job with a time limit ranks by what is left of it (users pad limits, but short limits
  still mean short jobs); jobs without a limit keep FIFO order inside a level.
* **Preemption with hysteresis.** A waiting job preempts only jobs at least
  ``preempt_gap`` levels below it that have run ``min_run_s`` in their current attempt,
  so restart/checkpoint overhead stays small and two similar jobs never ping-pong. A
  job ranked by its predicted remaining time only gets closer to the front as it runs,
  so the job it preempted never preempts it back. Every preemption's reason names both
  sides' figures (``preempt_words``).
* **No starvation, without churn.** A job waiting longer than ``starve_factor`` x the
  time it has already run (and at least ``starve_min_s``) jumps to the front: it takes
  GPUs as they come free before anyone else, and may preempt any job that is not
  starving itself (``starve_gap`` narrows that to jobs that rank no better: under a
  steady synthetic overload that halved mean JCT, on the real Philly trace it did not
  pay). Once
  started it is protected for ``starve_protect_s`` or ``protect_growth`` x what it had
  run before, whichever is longer: a long wide job promoted again and again gets longer
  runs each time (its protected runs double), instead of being cycled every hour.
* **Greedy fill.** Anything that fits starts; with preemption available, holding GPUs
  idle for a blocked wide job (as EASY backfill does) only costs utilisation: once it
  is starving, the wide job preempts what it needs.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

from gpufleet.scheduler.model import JobRequest, RunningJob
from gpufleet.scheduler.policies.base import BackfillMode, Context, Key, Policy
from gpufleet.scheduler.policies.las import attained, executed


@dataclass(frozen=True, kw_only=True)
class DefaultPolicy(Policy):
    name: ClassVar[str] = "default"
    backfill: ClassVar[BackfillMode] = "greedy"
    preemptive: ClassVar[bool] = True
    victim_class: ClassVar[int] = 3  # (priority, starving, level): then least lost work

    first_level_gpu_s: float = 1_800.0
    level_growth: float = 2.0
    """Levels twice as wide each (jobs within 2x of each other share one; issue 33's
    replays: finer than Tiresias' 10x ranks predicted jobs closer to SRTF)."""
    max_level: int = 16
    preempt_gap: int = 2
    """A victim ranks this many levels below its preemptor: at least 2x its figure, 4x
    as a rule (with ``level_growth`` 2)."""
    min_run_s: float = 600.0
    starve_factor: float = 4.0
    starve_min_s: float = 6 * 3600.0
    starve_max_s: float = math.inf
    starve_protect_s: float = 3600.0
    fresh_job_s: float = 1_800.0
    use_limits: bool = True
    predict_confidence: float = 0.3
    """A prediction at least this confident (``JobRequest.predicted_confidence``) ranks the
    job by its predicted remaining GPU-time; below it, by its limit or attained service.
    Above 1: predictions are ignored."""
    predict_fresh: bool = True
    """Rank a job that has not run yet by its prediction too; False: by the fresh-job floor
    (as attained service does), its prediction taking over once it has run."""
    protect_growth: float = 0.0
    """A job started because it starved is protected for ``starve_protect_s`` or this x
    the time it had run before that start, whichever is longer."""
    width_aware: bool = True
    tie_break: str = "submit"
    starve_gap: float = -math.inf
    """A starving job preempts non-starving jobs of its priority at least this many levels
    below its own (-inf, the default: any; 0: none that ranks better than it, a job
    probably nearer its end). Issue 33's replays (lost work since a 30-min checkpoint):
    under a steady 1.2 overload of ``trace synth`` jobs (20k, 40 x 8) starving jobs that
    may preempt anyone cycle the running ones (each victim starves in turn and preempts
    the next): mean JCT 8.29 h (``las`` 6.83 h), with 0 3.93 h. On the real Philly trace
    at load 1.21 (60 x 8), 0 is worse: 7.14 h against 6.99 h, and estimated starts go
    from a median error of 184 % to 8,725 % of the wait (starving jobs pile up at the
    front of the queue, while the jobs behind them start by preempting long ones, which
    the estimate does not foresee). Measured with ``bench/bench_predict.py --starve-gap``."""

    @cached_property
    def boundaries(self) -> tuple[float, ...]:
        """Service (GPU-seconds) at which level 1, 2, ... begins."""
        return tuple(self.first_level_gpu_s * self.level_growth**k for k in range(self.max_level))

    def level(self, service_gpu_s: float) -> int:
        return bisect.bisect_right(self.boundaries, service_gpu_s)

    def expected_remaining(self, job: JobRequest, running: RunningJob | None, now: float) -> float:
        """GPU-seconds the job probably still needs. With a time limit: what is left of
        it (users pad limits, but short limits still mean short jobs). Without: its
        attained service (heavy tails: a job tends to run as long again as it already
        has), but never less than a typical fresh job of its width."""
        return self._remaining(job, running, now)[0]

    def predicted(self, job: JobRequest) -> float | None:
        """The job's predicted run time if it is confident enough to rank it by, else None."""
        p = job.predicted_s
        return p if p is not None and job.predicted_confidence >= self.predict_confidence else None

    def _remaining(
        self, job: JobRequest, running: RunningJob | None, now: float
    ) -> tuple[float, float, float]:
        """(value, rate of change per second while running, time the formula changes)."""
        g = job.gpu_weight
        p = self.predicted(job)
        if p is not None:
            ran = executed(job, running, now)
            ranked = running is not None or job.executed_s > 0 or self.predict_fresh
            if ran < p and ranked:  # past its prediction it is a job of unknown length again
                if running is None:
                    return (p - ran) * g, 0.0, math.inf
                return (p - ran) * g, -g, now + (p - ran)
        if self.use_limits and job.time_limit_s is not None:
            left = max(0.0, job.time_limit_s - executed(job, running, now)) * g
            return left, (-g if running is not None and left > 0 else 0.0), math.inf
        got = attained(job, running, now)
        floor = g * self.fresh_job_s if self.width_aware else 0.0
        if got >= floor:
            return got, (g if running is not None else 0.0), math.inf
        switch = now + (floor - got) / g if running is not None else math.inf
        return floor, 0.0, switch

    def _level_until(self, job: JobRequest, running: RunningJob | None, now: float) -> tuple[int, float]:
        """The job's level now, and a time before which it certainly stays the same."""
        value, rate, switch = self._remaining(job, running, now)
        level = self.level(value)
        bounds = self.boundaries
        until = switch
        if rate > 0 and level < len(bounds):
            until = min(until, now + (bounds[level] - value) / rate)
        elif rate < 0 and level > 0:
            until = min(until, now + (value - bounds[level - 1]) / -rate)
        # Stay clear of the boundary itself, where rounding could tip a fresh computation.
        return level, (until - 1e-3 if until != math.inf else until)

    def patience(self, job: JobRequest) -> float:
        """How long a job may wait before it is promoted: ``starve_factor`` times what it
        has run, at least ``starve_min_s``, at most ``starve_max_s``."""
        return min(self.starve_max_s, max(self.starve_min_s, self.starve_factor * job.executed_s))

    def protection(self, job: JobRequest) -> float:
        """How long a job started because it starved is protected: ``starve_protect_s``, or
        ``protect_growth`` x what it had run before (``job.executed_s``) if longer."""
        return max(self.starve_protect_s, self.protect_growth * job.executed_s)

    def starving(self, job: JobRequest, running: RunningJob | None, now: float) -> bool:
        """Waiting too long for its size, or started because it was and still within its
        ``protection`` of that start: a promoted job gets a real run before the next
        short job may preempt it again (which would only reset its wait)."""
        if running is not None and now - running.started_at >= self.protection(job):
            return False
        waited = (running.started_at if running is not None else now) - job.queued_since
        return waited >= self.patience(job)

    def key(self, job: JobRequest, running: RunningJob | None, ctx: Context) -> Key:
        now = ctx.now
        if running is not None:
            hit: tuple[RunningJob, Key, float] | None = ctx.memo_of("running").get(id(running))
            if hit is not None and hit[0] is running and now < hit[2]:
                return hit[1]
        level, until = self._level_until(job, running, now)
        starving = -1 if self.starving(job, running, now) else 0
        if running is not None and starving:
            until = min(until, running.started_at + self.protection(job) - 1e-3)
        tie = job.gpus if self.tie_break == "width" else 0
        key = (-job.priority, starving, level, tie, job.submit_time, job.id)
        if running is not None:
            # A running job's key changes only when its level does: memoise until then.
            memo = ctx.memo_of("running")
            if len(memo) > 200_000:
                memo.clear()
            memo[id(running)] = (running, key, until)
        return key

    def running_key(self, running: RunningJob, ctx: Context) -> tuple[Key, float]:
        """``key``, valid for as long as ``key`` memoises it (until the job's level or
        its starvation protection changes)."""
        key = self.key(running.job, running, ctx)
        hit = ctx.memo_of("running").get(id(running))
        return key, (hit[2] if hit is not None and hit[0] is running and hit[1] == key else -math.inf)

    def order(self, pending: Sequence[JobRequest], ctx: Context) -> list[tuple[Key, JobRequest]]:
        """As ``key`` for waiting jobs, but with everything except the starvation flag
        memoised per job object (a waiting job's level does not change while it waits).
        ``patience`` and ``_remaining`` are inlined for waiting jobs: the server hands in
        fresh objects every pass, so this runs for every job of a 10,000-job queue
        (tests check that it agrees with ``key``)."""
        now = ctx.now
        memo: dict[int, tuple[Key, JobRequest]] = ctx.memo_of("order")
        if len(memo) > 400_000:
            memo.clear()
        bounds = self.boundaries
        with_limits = self.use_limits
        fresh_s = self.fresh_job_s
        width_aware = self.width_aware
        width_tie = self.tie_break == "width"
        starve_min, starve_max, factor = self.starve_min_s, self.starve_max_s, self.starve_factor
        trust = self.predict_confidence
        fresh_too = self.predict_fresh
        keyed: list[tuple[Key, JobRequest]] = []
        append = keyed.append
        for j in pending:
            hit = memo.get(id(j))
            if hit is None or hit[1] is not j:
                g = j.gpu_weight
                ran = j.executed_s
                since = j.submit_time if j.pending_since is None else j.pending_since
                due = since + min(starve_max, max(starve_min, factor * ran))
                limit = j.time_limit_s
                p = j.predicted_s
                if p is not None and p > ran and j.predicted_confidence >= trust and (ran > 0 or fresh_too):
                    value = (p - ran) * g
                elif with_limits and limit is not None:
                    value = max(0.0, limit - ran) * g
                else:
                    got = j.attained_service_s
                    floor = g * fresh_s if width_aware else 0.0
                    value = got if got >= floor else floor
                level = bisect.bisect_right(bounds, value)
                hit = memo[id(j)] = ((-j.priority, due, level, g if width_tie else 0, j.submit_time, j.id), j)
            prio, due, level, tie, submit, jid = hit[0]
            append(((prio, -1 if now >= due else 0, level, tie, submit, jid), j))
        keyed.sort(key=_first)
        return keyed

    def preemptible_from(self, victim: RunningJob) -> float:
        return victim.started_at + self.min_run_s

    def promoted(self, job: JobRequest, job_key: Key) -> tuple[float, Key] | None:
        if job_key[1] < 0:
            return None
        at = job.queued_since + self.patience(job)
        return None if at == math.inf else (at, (job_key[0], -1, *job_key[2:]))

    def victim_floor(self, job_key: Key) -> Key:
        if job_key[1] < 0:  # starving: non-starving jobs of its priority, ``starve_gap`` below it
            return (job_key[0], 0, job_key[2] + self.starve_gap - 1, math.inf)
        return (job_key[0], 0, job_key[2] + self.preempt_gap - 1, math.inf)

    def can_preempt(
        self, job: JobRequest, job_key: Key, victim: RunningJob, victim_key: Key, ctx: Context
    ) -> bool:
        if victim_key[0] != job_key[0]:
            return bool(victim_key[0] > job_key[0])  # user priority first
        if victim_key[1] < 0 or ctx.now - victim.started_at < self.min_run_s:
            return False  # promoted starving jobs and fresh starts are protected
        if job_key[1] < 0:
            return bool(victim_key[2] >= job_key[2] + self.starve_gap)
        return bool(victim_key[2] >= job_key[2] + self.preempt_gap)

    def preempt_words(self, job: JobRequest, victim: RunningJob, now: float) -> str:
        """Why ``job`` ranks before ``victim``: starvation, or both sides' figures (predicted
        or limit's GPU-hours left, or GPU-hours attained)."""
        if self.starving(job, None, now):
            return f"it waited {_hours(now - job.queued_since)}, starving"
        return f"{self.figure(job, None, now)} against {self.figure(victim.job, victim, now)}"

    def figure(self, job: JobRequest, running: RunningJob | None, now: float) -> str:
        """What ranks ``job``, in words: "predicted 0.4 h left (3.2 GPU-h)"..."""
        value = self._remaining(job, running, now)[0]
        p = self.predicted(job)
        ranked = running is not None or job.executed_s > 0 or self.predict_fresh
        if p is not None and ranked and executed(job, running, now) < p:
            return f"predicted {_hours(value / job.gpu_weight)} left ({value / 3600:.1f} GPU-h)"
        if self.use_limits and job.time_limit_s is not None:
            return f"{value / 3600:.1f} GPU-h of its limit left"
        return f"{attained(job, running, now) / 3600:.1f} GPU-h attained"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def _first(item: tuple[Key, JobRequest]) -> Key:
    return item[0]
