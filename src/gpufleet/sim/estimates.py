"""How honest the core's estimated starts were, and what a preemption or failure cost.

*Estimated starts.* A waiting job's estimated start is what ``gpufleet jobs show`` and
the page tell its owner (``PendingStatus.estimated_start``, from ``scheduler/estimate.py``).
The simulator keeps, for each job, the estimate of the first pass that saw it (the pass
right after its submit, as the owner would read it then) and compares it with when the
job really first started. Jobs that started in that first pass had nothing to estimate
and are left out of the errors (counted apart), as are jobs the pass gave no estimate
(held, unresolvable, waiting on power or a dependency with no known end): a median over
jobs that never waited would say nothing about the estimates.

*Lost work.* A job checkpoints every ``interval`` of its work, counted from each
(re)start: stopped after ``progress`` seconds of work in this attempt, it keeps
``floor(progress / interval) * interval`` and loses the rest (interval 0: it loses
nothing, the simulator's old graceful preemption).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from gpufleet.scheduler import Plan

EstimateMap = Mapping[str, float | None]
"""Job -> the estimated start the first pass that saw it gave (None: no estimate)."""


def kept_work(progress_s: float, interval_s: float) -> float:
    """The work (seconds) an attempt that did ``progress_s`` of it keeps when it stops:
    up to its last checkpoint, one every ``interval_s`` from the attempt's start (a
    checkpoint due at the very moment it stops counts as taken). ``interval_s`` <= 0:
    all of it."""
    if progress_s <= 0:
        return 0.0
    if interval_s <= 0:
        return progress_s
    return math.floor(progress_s / interval_s + 1e-9) * interval_s


def first_estimates(result: Plan, unseen: Iterable[str]) -> dict[str, float | None]:
    """The estimated start ``result`` gives each job of ``unseen`` (jobs no pass saw
    before): its ``PendingStatus.estimated_start``, or None. Jobs it starts are left
    out (they did not wait). ``result`` must come from an ``explain=True`` pass."""
    wanted = set(unseen)
    return {p.job_id: p.estimated_start for p in result.pending if p.job_id in wanted}


@dataclass(frozen=True, slots=True, kw_only=True)
class Actual:
    """What the job really did: submitted at ``submit_s``, first started at ``start_s``."""

    submit_s: float
    start_s: float


def estimate_accuracy(estimates: EstimateMap, actual: Mapping[str, Actual]) -> dict[str, float | None]:
    """Errors of the first estimates against the real first starts (``actual``: the jobs
    that ran; a job that never did is skipped):

    - ``started_at_once``: jobs that started in their first pass (nothing to estimate);
    - ``estimated_jobs``: jobs that waited past their first pass and had an estimate;
    - ``no_estimate_jobs``: jobs that waited past their first pass without one;
    - ``median_abs_error_s``: median of |estimate - start|;
    - ``median_rel_error``: median of |estimate - start| / (start - submit), the error
      as a share of the wait it predicted (jobs with a zero wait left out);
    - ``early_share``: share of the estimates that were too early (the job started
      later than promised), against too late.

    The medians are None when no job had an estimate."""
    abs_err: list[float] = []
    rel_err: list[float] = []
    early = 0
    missing = 0
    for job_id, est in estimates.items():
        real = actual.get(job_id)
        if real is None:
            continue
        if est is None:
            missing += 1
            continue
        err = abs(est - real.start_s)
        abs_err.append(err)
        early += real.start_s > est
        wait = real.start_s - real.submit_s
        if wait > 0:
            rel_err.append(err / wait)
    return {
        "started_at_once": float(sum(1 for job_id in actual if job_id not in estimates)),
        "estimated_jobs": float(len(abs_err)),
        "no_estimate_jobs": float(missing),
        "median_abs_error_s": float(np.median(abs_err)) if abs_err else None,
        "median_rel_error": float(np.median(rel_err)) if rel_err else None,
        "early_share": early / len(abs_err) if abs_err else None,
    }
