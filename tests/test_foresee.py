"""Estimated starts foresee preemptions (``scheduler/foresee.py``) under ``default`` with
``foresee_preemptions`` on: a waiting job is booked when it could preempt, not only when
GPUs come free. Off (the default), estimates are as before."""

from __future__ import annotations

import pytest

from factories import job, running, snapshot, uniform_fleet
from gpufleet.scheduler import JobRequest, RunningJob, plan
from gpufleet.scheduler.policies import make_policy

H = 3600.0
ALL8 = tuple(range(8))


def big(**kw: object) -> RunningJob:
    """8 GPUs for a day, started at 0: preemptible from 600 (``min_run_s``)."""
    return running("big", {"n0": ALL8}, started=0.0, time_limit_s=24 * H, **kw)


CASES = [
    pytest.param(
        {}, (job("s", 8, submit=50, time_limit_s=60),), {"s": 600.0}, id="short-job-at-victims-min-run"
    ),
    pytest.param(
        {"preemptible": False},
        (job("s", 8, submit=50, time_limit_s=60),),
        {"s": 24 * H},
        id="non-preemptible-victim-runs-to-its-end",
    ),
    pytest.param(
        {},
        (job("s1", 8, submit=50, time_limit_s=60), job("s2", 8, submit=60, time_limit_s=60)),
        {"s1": 600.0, "s2": 660.0},
        id="a-victim-is-taken-once-queue-order-kept",
    ),
    pytest.param(
        {},
        (job("peer", 8, submit=0, time_limit_s=24 * H),),
        {"peer": 6 * H},
        id="same-level-job-preempts-once-starving",
    ),
]


@pytest.mark.parametrize(("victim", "pending", "want"), CASES)
def test_estimates_foresee_preemptions(
    victim: dict[str, object], pending: tuple[JobRequest, ...], want: dict[str, float]
) -> None:
    snap = snapshot(uniform_fleet(1), now=100.0, running_jobs=(big(**victim),), pending=pending)
    got = plan(snap, make_policy("default", foresee_preemptions=True))
    assert not got.starts and not got.preemptions
    assert {p.job_id: p.estimated_start for p in got.pending} == want


def test_off_by_default_and_fifo_foresees_nothing() -> None:
    snap = snapshot(
        uniform_fleet(1), now=100.0, running_jobs=(big(),), pending=(job("s", 8, submit=50, time_limit_s=60),)
    )
    assert plan(snap, "default").pending[0].estimated_start == 24 * H
    assert plan(snap, make_policy("fifo", foresee_preemptions=True)).pending[0].estimated_start == 24 * H
