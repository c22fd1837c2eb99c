"""The synthetic trace: deterministic per seed, at the asked load, and shaped as documented."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

from gpufleet.sim.synth import DAY_S, MAX_DURATION_S, MIN_DURATION_S, synthesize
from gpufleet.sim.trace import TraceJob, offered_load


@dataclass(frozen=True, kw_only=True)
class Fleet:
    nodes: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


FLEETS = {
    "default-50x8": Fleet(nodes=50, gpus_per_node=8),
    "tiny-2x4": Fleet(nodes=2, gpus_per_node=4),
    "single-gpu": Fleet(nodes=1, gpus_per_node=1),
}


def _trace(fleet: Fleet, *, jobs: int = 2_000, seed: int = 3, load: float = 0.9) -> list[TraceJob]:
    return synthesize(jobs=jobs, seed=seed, load=load, nodes=fleet.nodes, gpus_per_node=fleet.gpus_per_node)


def test_same_seed_gives_identical_jobs() -> None:
    assert synthesize(jobs=500, seed=11) == synthesize(jobs=500, seed=11)


def test_different_seed_gives_different_jobs() -> None:
    assert synthesize(jobs=500, seed=11) != synthesize(jobs=500, seed=12)


@pytest.mark.parametrize(
    ("load", "seed", "fleet"),
    [
        (0.9, 1, FLEETS["default-50x8"]),
        (0.5, 2, FLEETS["default-50x8"]),
        (1.3, 3, FLEETS["default-50x8"]),
        (0.8, 4, FLEETS["tiny-2x4"]),
    ],
    ids=["default", "half-load", "overload", "tiny-fleet"],
)
def test_offered_load_matches_target(load: float, seed: int, fleet: Fleet) -> None:
    jobs = _trace(fleet, jobs=5_000, seed=seed, load=load)

    assert offered_load(jobs, fleet.gpus) == pytest.approx(load, rel=0.15)


@pytest.mark.parametrize("fleet", list(FLEETS.values()), ids=list(FLEETS))
def test_gangs_are_powers_of_two_within_the_fleet(fleet: Fleet) -> None:
    gangs = {job.gpus for job in _trace(fleet)}

    assert all(gpus & (gpus - 1) == 0 and 1 <= gpus <= min(fleet.gpus, 32) for gpus in gangs)
    assert max(gangs) == min(fleet.gpus, 32)


def test_most_jobs_use_one_gpu() -> None:
    share = Counter(job.gpus for job in _trace(FLEETS["default-50x8"]))[1] / 2_000

    assert 0.65 <= share <= 0.75


def test_durations_are_bounded_and_heavy_tailed() -> None:
    durations = sorted(job.duration_s for job in _trace(FLEETS["default-50x8"], jobs=5_000))
    median = durations[len(durations) // 2]
    mean = sum(durations) / len(durations)

    assert durations[0] >= MIN_DURATION_S and durations[-1] <= MAX_DURATION_S
    assert 15 * 60 <= median <= 45 * 60
    assert 3_600 <= mean <= 6 * 3_600


def test_time_limits_cover_durations_in_whole_quarter_hours() -> None:
    jobs = _trace(FLEETS["default-50x8"])
    limits = [(job.duration_s, job.time_limit_s) for job in jobs if job.time_limit_s is not None]

    assert all(duration <= limit <= 5 * duration + 900 for duration, limit in limits)
    assert all(limit % 900 == 0 for _, limit in limits)
    assert 0.05 <= 1 - len(limits) / len(jobs) <= 0.15


def test_arrivals_are_sorted_and_diurnal() -> None:
    jobs = _trace(FLEETS["default-50x8"], jobs=5_000)
    submits = [job.submit_s for job in jobs]
    hours = Counter(int(t % DAY_S // 3600) // 6 for t in submits)

    assert submits == sorted(submits)
    assert submits[0] >= 0.0
    assert hours[2] > 2 * hours[0]  # 12:00-18:00 busier than 00:00-06:00


def test_shape_fields() -> None:
    jobs = synthesize(jobs=1_000, seed=5, teams=3, users=7)

    assert len({job.job_id for job in jobs}) == 1_000
    assert len({job.user for job in jobs}) <= 7 and len({job.team for job in jobs}) <= 3
    assert all(job.gpus_per_node == 0 and job.gpu_type is None for job in jobs)
    assert Counter(job.priority for job in jobs)[0] >= 900


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"jobs": -1}, "jobs >= 0"),
        ({"jobs": 10, "load": 0.0}, "load > 0"),
        ({"jobs": 10, "nodes": 0}, "node"),
    ],
    ids=["negative-jobs", "zero-load", "no-nodes"],
)
def test_invalid_arguments_raise(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        synthesize(seed=0, **kwargs)


def test_no_jobs_and_offered_load_edges() -> None:
    assert synthesize(jobs=0, seed=1) == []
    assert offered_load([], 8) == 0.0
    one = synthesize(jobs=1, seed=1)
    assert offered_load(one, 8) == float("inf")
