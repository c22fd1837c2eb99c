"""Predicted durations (issue 33): the predictor, the simulator that feeds it causally,
``default`` ranking by predicted remaining GPU-time, preemption reasons that name the
figures, and estimated starts from predicted ends. Pure core and small hand-made traces."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from factories import job, running, snapshot, uniform_fleet
from gpufleet.scheduler import make_policy, plan
from gpufleet.scheduler.estimate import expected_end
from gpufleet.scheduler.policies.default import DefaultPolicy
from gpufleet.scheduler.predict import DurationPredictor, JobTraits
from gpufleet.sim import FleetSpec, SimConfig, Simulator, TraceJob
from gpufleet.sim.loaders.gpufleet_csv import load_gpufleet_csv, write_gpufleet_csv

H = 3600.0


def _learned(durations: list[float], traits: JobTraits) -> DurationPredictor:
    p = DurationPredictor()
    for d in durations:
        p.observe(traits, d)
    return p


@pytest.mark.parametrize(
    ("history", "asked", "want_s", "basis"),
    [
        pytest.param([H, H, H], JobTraits(user="u", name="n", gpus=8), H, "user+name+gpus", id="exact-key"),
        pytest.param([H, H, H], JobTraits(user="u", name="n", gpus=4), H, "user+name", id="other-width"),
        pytest.param([H, H, H], JobTraits(user="v", team="t", gpus=8), H, "team+gpus", id="team-only"),
        pytest.param([H, H], JobTraits(user="u", name="n", gpus=8), None, "", id="too-few"),
        pytest.param(
            [H, 2 * H, 4 * H], JobTraits(user="u", name="n", gpus=8), 2 * H, "user+name+gpus", id="median"
        ),
    ],
)
def test_predictor_uses_the_most_specific_key_with_history(
    history: list[float], asked: JobTraits, want_s: float | None, basis: str
) -> None:
    p = _learned(history, JobTraits(user="u", team="t", name="n", gpus=8))
    got = p.predict(asked)
    if want_s is None:
        assert got is None
        return
    assert got is not None
    assert got.duration_s == pytest.approx(want_s)
    assert got.basis.startswith(basis)


def test_confidence_falls_with_spread_and_the_limit_caps() -> None:
    same = _learned([H] * 6, JobTraits(user="u", name="n", gpus=1)).predict(JobTraits(user="u", name="n"))
    wild = _learned([60.0, H, 3 * 86_400.0] * 2, JobTraits(user="u", name="n", gpus=1)).predict(
        JobTraits(user="u", name="n")
    )
    assert same is not None and wild is not None
    assert same.confidence > 0.9 > 0.2 > wild.confidence
    capped = _learned([H] * 3, JobTraits(user="u", name="n")).predict(
        JobTraits(user="u", name="n", time_limit_s=600.0)
    )
    assert capped is not None and capped.duration_s == 600.0


@pytest.mark.parametrize(
    ("victim_kw", "pending_kw", "victims"),
    [
        pytest.param(
            {"predicted_s": 40 * H, "predicted_confidence": 0.9},
            {"predicted_s": 0.5 * H, "predicted_confidence": 0.9},
            ["long"],
            id="predicted-short-preempts-predicted-long",
        ),
        pytest.param(
            {"predicted_s": 3.2 * H, "predicted_confidence": 0.9},
            {"predicted_s": 3 * H, "predicted_confidence": 0.9},
            [],
            id="similar-predictions-no-preemption",
        ),
        pytest.param(
            {"predicted_s": 3.2 * H, "predicted_confidence": 0.9},
            {"predicted_s": 3 * H, "predicted_confidence": 0.1},
            [],
            id="victim-predicted-nearly-done-is-kept",
        ),
        pytest.param(
            {"predicted_s": 3.2 * H, "predicted_confidence": 0.1},
            {"predicted_s": 0.5 * H, "predicted_confidence": 0.9},
            ["long"],
            id="unconfident-victim-ranks-by-its-attained-service",
        ),
    ],
)
def test_default_ranks_by_predicted_remaining_gpu_time(
    victim_kw: dict[str, float], pending_kw: dict[str, float], victims: list[str]
) -> None:
    # "long" has run 3 h on 8 GPUs (24 GPU-h attained).
    run = (running("long", {"n0": tuple(range(8))}, started=-3 * H, **victim_kw),)
    got = plan(
        snapshot(uniform_fleet(1), now=0.0, running_jobs=run, pending=(job("new", 8, **pending_kw),)),
        "default",
    )
    assert [p.job_id for p in got.preemptions] == victims


def test_a_preempted_job_never_preempts_its_preemptor_back() -> None:
    """The preemptor's predicted remaining time only falls as it runs; the victim's stays."""
    pol = DefaultPolicy()
    victim = job("long", 8, submit=0.0, predicted_s=40 * H, predicted_confidence=0.9, executed_s=3 * H)
    for ran in (0.2 * H, H, 1.9 * H):
        now = 10 * H + ran
        short = running(
            "short", {"n0": tuple(range(8))}, started=10 * H, predicted_s=2 * H, predicted_confidence=0.9
        )
        snap = snapshot(uniform_fleet(1), now=now, running_jobs=(short,), pending=(victim,))
        assert plan(snap, pol).preemptions == ()


def test_preemption_reason_names_the_predicted_figures() -> None:
    run = (
        running("long", {"n0": tuple(range(8))}, started=-H, predicted_s=10 * H, predicted_confidence=0.9),
    )
    pend = (job("new", 1, predicted_s=0.4 * H, predicted_confidence=0.9),)
    got = plan(snapshot(uniform_fleet(1), now=0.0, running_jobs=run, pending=pend), "default")
    (pre,) = got.preemptions
    assert "predicted 0.4 h left (0.4 GPU-h) against predicted 9.0 h left (72.0 GPU-h)" in pre.reason
    assert pre.reason.startswith("preempted for job new (default; ")


def test_a_starving_job_says_so_in_the_reason() -> None:
    pol = make_policy("default", starve_min_s=H, starve_factor=1.0)
    run = (running("r", {"n0": tuple(range(8))}, started=-5 * H),)
    # the same level as "r" (40 GPU-h attained each): only starving lets it preempt
    pend = (job("old", 8, submit=-3 * H, attained_service_s=40 * H, executed_s=100.0, pending_since=-3 * H),)
    (pre,) = plan(snapshot(uniform_fleet(1), now=0.0, running_jobs=run, pending=pend), pol).preemptions
    assert "it waited 3.0 h, starving" in pre.reason


@pytest.mark.parametrize(
    ("victim_attained_h", "preempts"),
    [
        pytest.param(32.0, True, id="same-level"),  # 32 + 8 GPU-h of this run: 40, as "old"
        pytest.param(400.0, True, id="victim-ranks-worse"),
        pytest.param(0.0, False, id="victim-ranks-better"),  # 8 GPU-h attained
    ],
)
def test_with_starve_gap_0_a_starving_job_preempts_only_jobs_ranked_no_better(
    victim_attained_h: float, preempts: bool
) -> None:
    """``starve_gap`` 0: a starving job never preempts one that ranks better than itself
    (by default, -inf, it preempts any job that is not starving itself)."""
    default = make_policy("default", starve_min_s=H, starve_factor=1.0)
    pol = make_policy("default", starve_min_s=H, starve_factor=1.0, starve_gap=0)
    run = (running("r", {"n0": tuple(range(8))}, started=-H, attained_service_s=victim_attained_h * H),)
    pend = (job("old", 8, submit=-3 * H, attained_service_s=40 * H, executed_s=100.0, pending_since=-3 * H),)
    got = plan(snapshot(uniform_fleet(1), now=0.0, running_jobs=run, pending=pend), pol)
    assert bool(got.preemptions) is preempts
    if not preempts:  # it waits first in line: the GPUs go to it as they come free
        assert [p.job_id for p in got.pending] == ["old"]
    assert plan(snapshot(uniform_fleet(1), now=0.0, running_jobs=run, pending=pend), default).preemptions


@pytest.mark.parametrize(
    ("executed", "protected"),
    [
        pytest.param(0.0, False, id="fresh-job-1h"),
        pytest.param(10 * H, True, id="ran-10h-before-protected-10h"),
    ],
)
def test_protection_of_a_promoted_job_grows_with_what_it_ran(executed: float, protected: bool) -> None:
    now = 100 * H
    started = now - 2 * H  # it has run 2 h in this attempt, after waiting 50 h
    old = running("old", {"n0": tuple(range(8))}, started=started, attained_service_s=8 * executed + 1e6)
    old = replace(old, job=replace(old.job, executed_s=executed, pending_since=started - 50 * H))
    pend = (job("new", 8, submit=now - 60),)
    pol = make_policy("default", protect_growth=1.0)
    got = plan(snapshot(uniform_fleet(1), now=now, running_jobs=(old,), pending=pend), pol)
    assert [p.job_id for p in got.preemptions] == ([] if protected else ["old"])


@pytest.mark.parametrize(
    ("predicted", "limit", "ran", "end"),
    [
        pytest.param(None, None, H, 4 * H, id="no-prediction-default-limit"),
        pytest.param(2 * H, None, H, 2 * H, id="what-is-left-of-the-prediction"),
        pytest.param(2 * H, 1.5 * H, H, 1.5 * H, id="never-past-the-time-limit"),
        pytest.param(2 * H, None, 4 * H, 6 * H, id="overran-half-again"),
    ],
)
def test_expected_end_of_a_running_job(
    predicted: float | None, limit: float | None, ran: float, end: float
) -> None:
    rj = running("r", {"n0": (0,)}, started=0.0, predicted_s=predicted, time_limit_s=limit)
    assert expected_end(make_policy("default"), rj, ran) == pytest.approx(end)


def test_estimated_start_follows_the_predicted_end() -> None:
    run = (running("r", {"n0": tuple(range(8))}, started=0.0, predicted_s=H, predicted_confidence=0.1),)
    got = plan(
        snapshot(uniform_fleet(1), now=600.0, running_jobs=run, pending=(job("w", 8, submit=600.0),)), "fifo"
    )
    assert got.pending[0].estimated_start == pytest.approx(H)


def _trace() -> list[TraceJob]:
    """Five 2-hour runs of one named job, then a 10-minute job and the sixth long run."""
    jobs = [
        TraceJob(
            job_id=f"l{i}", user="u", team="t", name="train", submit_s=i * 3 * H, duration_s=2 * H, gpus=1
        )
        for i in range(5)
    ]
    jobs.append(TraceJob(job_id="s", user="v", team="t", submit_s=15 * H, duration_s=600.0, gpus=1))
    jobs.append(
        TraceJob(job_id="l5", user="u", team="t", name="train", submit_s=15 * H, duration_s=2 * H, gpus=1)
    )
    return jobs


def test_the_simulator_predicts_from_jobs_that_ended_before_the_submit() -> None:
    fleet = FleetSpec(nodes=2, gpus_per_node=1, nodes_per_leaf=2).build()
    sim = Simulator(_trace(), fleet, make_policy("fifo"), SimConfig(sched_interval_s=1.0))
    sim.run()
    seen = {j.trace.job_id: j.request.predicted_s for j in sim.done}
    # l0..l2 have fewer than 3 ended jobs behind them; l3 was submitted at 9 h, when
    # l0..l2 had ended (at 2, 5, 8 h): predicted 2 h; "s" has no history of its own
    # but its team's (t): the team median, 2 h.
    assert [seen[f"l{i}"] for i in range(3)] == [None, None, None]
    assert seen["l3"] == seen["l4"] == seen["l5"] == seen["s"] == 2 * H
    off = Simulator(_trace(), fleet, make_policy("fifo"), SimConfig(sched_interval_s=1.0, predict=False))
    off.run()
    assert {j.request.predicted_s for j in off.done} == {None}


def test_the_gpufleet_csv_carries_job_names(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_gpufleet_csv(path, _trace())
    loaded = load_gpufleet_csv(path)
    assert [j.name for j in loaded.jobs] == [
        j.name for j in sorted(_trace(), key=lambda j: (j.submit_s, j.job_id))
    ]
    assert path.read_text().splitlines()[0].endswith(",name")


@pytest.mark.parametrize(
    ("predict_fresh", "victims"),
    [
        pytest.param(True, [], id="fresh-job-ranked-by-its-long-prediction"),
        pytest.param(False, ["r"], id="by-floor"),
    ],
)
def test_a_fresh_job_ranks_by_its_prediction_or_the_fresh_floor(
    predict_fresh: bool, victims: list[str]
) -> None:
    """``predict_fresh`` False: a job that has not run yet ranks as attained service ranks
    it (the fresh-job floor), its prediction taking over once it has run."""
    run = (running("r", {"n0": tuple(range(8))}, started=-3 * H),)  # 24 GPU-h attained, no prediction
    pend = (job("new", 8, predicted_s=40 * H, predicted_confidence=0.9),)
    pol = make_policy("default", predict_fresh=predict_fresh)
    got = plan(snapshot(uniform_fleet(1), now=0.0, running_jobs=run, pending=pend), pol)
    assert [p.job_id for p in got.preemptions] == victims
