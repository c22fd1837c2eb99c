"""Checkpoint-aware victim choice (issue 33): among equally ranked victims the core
preempts the one that loses least work, and every preemption's reason says what."""

from __future__ import annotations

import pytest

from factories import job, snapshot, uniform_fleet
from gpufleet.scheduler import NodeGpus, RunningJob, plan
from gpufleet.scheduler.victims import lost_work

NOW = 100_000.0


def victim(
    job_id: str,
    gpus: tuple[int, ...],
    *,
    started: float = 0.0,
    submit: float = 0.0,
    every: float | None = None,
    before_s: float = 0.0,
) -> RunningJob:
    """A running job on n0 holding ``gpus``; ``before_s``: seconds it ran in earlier
    attempts (its attained service carries them, so two victims can share a level
    although they started at different times)."""
    n = len(gpus)
    return RunningJob(
        job=job(
            job_id,
            n,
            submit=submit,
            checkpoint_s=every,
            attained_service_s=n * before_s,
            executed_s=before_s,
        ),
        placement=(NodeGpus(node="n0", gpus=gpus),),
        started_at=started,
    )


A = (0, 1, 2, 3)
B = (4, 5, 6, 7)

# Every case: one 8-GPU node held by two 4-GPU victims, a fresh 4-GPU job waits. Without
# the loss rule the worse key ("b", by id) would always go.
CASES = [
    pytest.param(
        "default",
        (victim("a", A, every=33_000.0), victim("b", B, every=30_000.0)),
        "a",
        id="default-the-one-that-just-checkpointed",  # a lost 1,000 s x 4, b 10,000 s x 4
    ),
    pytest.param(
        "default",
        (victim("a", A, started=99_000.0, before_s=99_000.0), victim("b", B)),
        "a",
        id="default-no-interval-whole-attempt-counts",  # a: 1,000 s of this attempt, b: 100,000
    ),
    pytest.param(
        "default",
        (victim("a", A, started=90_000.0, before_s=90_000.0), victim("b", B, every=1_800.0)),
        "b",
        id="default-declared-interval-beats-none",  # b lost 1,000 s x 4, a 10,000 s x 4
    ),
    pytest.param(
        "default",
        (victim("a", A, every=33_000.0), victim("b", B, every=33_000.0)),
        "b",
        id="default-equal-loss-keeps-rank-order",
    ),
    pytest.param(
        "default",
        (victim("a", A, every=33_000.0), victim("b", B, every=30_000.0, before_s=400_000.0)),
        "b",
        id="default-a-worse-rank-class-goes-first-whatever-it-loses",  # b is a level further
    ),
    pytest.param(
        "las",
        (victim("a", A, every=33_000.0), victim("b", B, every=30_000.0)),
        "a",
        id="las-the-one-that-just-checkpointed",
    ),
    pytest.param(
        "las",
        (victim("a", A, started=99_000.0, before_s=99_000.0), victim("b", B)),
        "a",
        id="las-no-interval-whole-attempt-counts",
    ),
]


@pytest.mark.parametrize(("policy", "run", "want"), CASES)
def test_the_victim_that_loses_least_goes(policy: str, run: tuple[RunningJob, ...], want: str) -> None:
    pending = (job("new", 4, submit=NOW - 10),)
    got = plan(snapshot(uniform_fleet(1), now=NOW, running_jobs=run, pending=pending), policy)
    assert [p.job_id for p in got.preemptions] == [want]
    assert [s.job_id for s in got.starts] == ["new"]


@pytest.mark.parametrize(
    ("run", "reason"),
    [
        pytest.param(
            victim("a", A, every=33_000.0),
            "preempted for job new (default; 0.0 GPU-h attained against 111.1 GPU-h attained);"
            " loses 1.11 GPU-h since its last checkpoint (every 33000s)",
            id="declared",
        ),
        pytest.param(
            victim("a", A, started=99_100.0, before_s=99_000.0),
            "preempted for job new (default; 0.0 GPU-h attained against 111.0 GPU-h attained);"
            " loses 1.00 GPU-h since it started (no checkpoint interval declared)",
            id="none-declared",
        ),
    ],
)
def test_the_reason_names_the_preemptor_and_the_work_lost(run: RunningJob, reason: str) -> None:
    pending = (job("new", 8, submit=NOW - 10),)
    got = plan(snapshot(uniform_fleet(1), now=NOW, running_jobs=(run,), pending=pending), "default")
    assert [(p.job_id, p.by, p.reason) for p in got.preemptions] == [("a", "new", reason)]


@pytest.mark.parametrize(
    ("gpus", "started", "every", "want"),
    [
        pytest.param(4, 0.0, None, 4 * NOW, id="no-interval-whole-attempt"),
        pytest.param(4, 0.0, 30_000.0, 4 * 10_000.0, id="run-time-mod-interval"),
        pytest.param(2, 0.0, 25_000.0, 0.0, id="just-checkpointed"),
        pytest.param(2, 0.0, 0.0, 2 * NOW, id="zero-interval-as-none"),
        pytest.param(8, NOW + 5, 60.0, 0.0, id="not-started-yet"),
    ],
)
def test_lost_work(gpus: int, started: float, every: float | None, want: float) -> None:
    rj = victim("j", tuple(range(gpus)), started=started, every=every)
    assert lost_work(rj, NOW) == pytest.approx(want)
