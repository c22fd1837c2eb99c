"""A synthetic trace shaped like the published ones (Philly, Helios, PAI), for when a
site has no trace of its own or a test needs a controlled load.

Distributions (all drawn from one ``np.random.default_rng(seed)``, so the same
arguments give the same list):

* **Duration**: 95% lognormal body (median 25 min, sigma 1.7), 5% Pareto tail
  (scale 4 h, alpha 1.8); rounded to whole seconds and clipped to [60 s, 14 days].
  Median ~28 min, mean ~2 h.
* **Gang size**: 1, 2, 4, 8, 16, 32 GPUs with probability .70, .10, .08, .07, .03, .02;
  sizes above the fleet (``nodes * gpus_per_node``) are dropped and the rest renormalised.
* **Arrivals**: a non-homogeneous Poisson process with rate proportional to
  ``(1 + 0.6 cos(2 pi (hour - 15) / 24)) * (0.5 on Saturday and Sunday)``, so the
  peak is at 15:00 and the trough at 03:00; ``t = 0`` is Monday 00:00. The process is
  taken conditioned on exactly ``jobs`` arrivals in a window ``[0, T]``: the arrivals
  are uniform candidates thinned by ``rate(t) / max rate``. ``T`` is set from the drawn
  work, ``T = sum(gpus * duration) / (fleet GPUs * load)``, so the offered load (see
  ``offered_load``) equals ``load`` up to the ~1/jobs gap at the window's edges,
  not merely in expectation: a heavy tail would otherwise let one 14-day gang move the
  load of a 5,000-job trace by tens of percent.
* **Users and teams**: users are spread evenly over teams at random; a job's user is
  drawn with Zipf weights 1/rank, so a few users submit most jobs.
* **Time limit**: ``duration * U(1.2, 5)`` rounded up to whole 15 minutes (users
  over-ask); 10% of jobs request none (None).
* **Priority** 0 for 95% of jobs, 1 for 5%. ``gpu_type`` None, ``gpus_per_node`` 0.
"""

from __future__ import annotations

import math

import numpy as np

from gpufleet.sim.trace import TraceJob

DAY_S = 86400.0
MIN_DURATION_S = 60.0
MAX_DURATION_S = 14 * DAY_S
GANG_SIZES = (1, 2, 4, 8, 16, 32)
GANG_WEIGHTS = (0.70, 0.10, 0.08, 0.07, 0.03, 0.02)
BODY_MEDIAN_S = 25 * 60.0
BODY_SIGMA = 1.7
TAIL_SHARE = 0.05
TAIL_SCALE_S = 4 * 3600.0
TAIL_ALPHA = 1.8
DIURNAL_AMPLITUDE = 0.6
PEAK_HOUR = 15.0
WEEKEND_FACTOR = 0.5
LIMIT_PADDING = (1.2, 5.0)
LIMIT_QUANTUM_S = 900.0
NO_LIMIT_SHARE = 0.10
HIGH_PRIORITY_SHARE = 0.05


def synthesize(
    *,
    jobs: int,
    seed: int,
    load: float = 0.9,
    nodes: int = 50,
    gpus_per_node: int = 8,
    teams: int = 6,
    users: int = 40,
) -> list[TraceJob]:
    """``jobs`` synthetic jobs offering ``load`` to a fleet of ``nodes * gpus_per_node``
    GPUs, sorted by submit time. Raises ValueError on impossible arguments."""
    if jobs < 0 or not load > 0 or nodes < 1 or gpus_per_node < 1 or teams < 1 or users < 1:
        raise ValueError(
            f"synthesize needs jobs >= 0, load > 0 and at least one node, GPU, team and user; "
            f"got jobs={jobs} load={load} nodes={nodes} gpus_per_node={gpus_per_node} "
            f"teams={teams} users={users}"
        )
    if jobs == 0:
        return []
    rng = np.random.default_rng(seed)
    fleet = nodes * gpus_per_node
    durations = sample_durations(rng, jobs)
    gangs = sample_gangs(rng, jobs, fleet)
    window_s = float(np.sum(gangs * durations)) / (fleet * load)
    submits = sample_arrivals(rng, jobs, window_s)
    team_of_user = rng.permutation(np.arange(users) % teams)
    activity = 1.0 / np.arange(1, users + 1)
    job_users = rng.choice(users, size=jobs, p=activity / activity.sum())
    padding = rng.uniform(*LIMIT_PADDING, size=jobs)
    limits = np.ceil(durations * padding / LIMIT_QUANTUM_S) * LIMIT_QUANTUM_S
    no_limit = rng.random(jobs) < NO_LIMIT_SHARE
    high = rng.random(jobs) < HIGH_PRIORITY_SHARE
    width = len(str(jobs - 1))
    return [
        TraceJob(
            job_id=f"synth-{i:0{width}d}",
            user=f"user-{job_users[i]:0{len(str(users - 1))}d}",
            team=f"team-{team_of_user[job_users[i]]:0{len(str(teams - 1))}d}",
            submit_s=float(submits[i]),
            duration_s=float(durations[i]),
            gpus=int(gangs[i]),
            time_limit_s=None if no_limit[i] else float(limits[i]),
            priority=1 if high[i] else 0,
        )
        for i in range(jobs)
    ]


def sample_durations(rng: np.random.Generator, count: int) -> np.ndarray:
    """Seconds: lognormal body with a Pareto tail, whole seconds in [60 s, 14 days]."""
    body = rng.lognormal(mean=math.log(BODY_MEDIAN_S), sigma=BODY_SIGMA, size=count)
    tail = TAIL_SCALE_S * (1.0 + rng.pareto(TAIL_ALPHA, size=count))
    in_tail = rng.random(count) < TAIL_SHARE
    return np.clip(np.round(np.where(in_tail, tail, body)), MIN_DURATION_S, MAX_DURATION_S)


def sample_gangs(rng: np.random.Generator, count: int, fleet_gpus: int) -> np.ndarray:
    """Power-of-two GPU counts no larger than the fleet."""
    sizes = np.array([size for size in GANG_SIZES if size <= fleet_gpus])
    weights = np.array(GANG_WEIGHTS[: len(sizes)])
    return rng.choice(sizes, size=count, p=weights / weights.sum())


def arrival_weight(t_s: np.ndarray) -> np.ndarray:
    """Relative arrival rate at ``t_s`` seconds after Monday 00:00, at most 1."""
    hour = (t_s % DAY_S) / 3600.0
    daily = 1.0 + DIURNAL_AMPLITUDE * np.cos(2 * np.pi * (hour - PEAK_HOUR) / 24.0)
    weekend = (t_s // DAY_S) % 7 >= 5
    return daily * np.where(weekend, WEEKEND_FACTOR, 1.0) / (1.0 + DIURNAL_AMPLITUDE)


def sample_arrivals(rng: np.random.Generator, count: int, window_s: float) -> np.ndarray:
    """``count`` sorted arrival times of the diurnal process on ``[0, window_s]``, by thinning."""
    accepted: list[np.ndarray] = []
    have = 0
    while have < count:
        candidates = rng.uniform(0.0, window_s, size=2 * (count - have) + 16)
        kept = candidates[rng.random(candidates.size) < arrival_weight(candidates)]
        accepted.append(kept)
        have += kept.size
    return np.sort(np.concatenate(accepted)[:count])
