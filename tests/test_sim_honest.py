"""The simulator's honesty (issue 33): work lost since the last checkpoint, arrivals seen
by the pass of their instant, estimated starts against real ones, and what the report
says about the trace. Small hand-made traces whose right answers are known."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.scheduler import POLICIES, make_policy
from gpufleet.sim import FleetSpec, SimConfig, SimResult, Simulator, TraceJob
from gpufleet.sim.estimates import kept_work
from gpufleet.sim.loaders.gpufleet_csv import load_gpufleet_csv, write_gpufleet_csv
from gpufleet.sim.tracecheck import censoring_warnings, policy_notes, trace_facts, weekly_loads
from test_sim import assert_no_gpu_shared, small_trace

MIN = 60.0
DAY = 86_400.0


def job(job_id: str, submit: float, duration: float, gpus: int = 1, **kw: object) -> TraceJob:
    return TraceJob(job_id=job_id, user="u", team="t", submit_s=submit, duration_s=duration, gpus=gpus, **kw)  # type: ignore[arg-type]


def replay(
    jobs: list[TraceJob], policy: str = "default", *, gpus: int = 1, **cfg: object
) -> tuple[Simulator, SimResult]:
    fleet = FleetSpec(nodes=1, gpus_per_node=gpus, nodes_per_leaf=1).build()
    config = SimConfig(**{"restart_overhead_s": 0.0, "sched_interval_s": 1.0, **cfg})  # type: ignore[arg-type]
    sim = Simulator(jobs, fleet, make_policy(policy), config, record=True)
    return sim, sim.run()


@pytest.mark.parametrize(
    ("progress", "interval", "kept"),
    [
        (45 * MIN, 30 * MIN, 30 * MIN),
        (30 * MIN, 30 * MIN, 30 * MIN),  # a checkpoint due at the stop counts
        (29 * MIN, 30 * MIN, 0.0),
        (45 * MIN, 0.0, 45 * MIN),  # no lost-work model: all kept
        (0.0, 30 * MIN, 0.0),
        (100 * MIN, 10 * MIN, 100 * MIN),
    ],
    ids=["45m-of-30m", "on-the-checkpoint", "before-the-first", "off", "nothing-done", "exact-multiple"],
)
def test_kept_work(progress: float, interval: float, kept: float) -> None:
    assert kept_work(progress, interval) == pytest.approx(kept)


@pytest.mark.parametrize(
    ("gpus", "interval", "declared", "lost_s", "long_finish"),
    [
        (1, 30 * MIN, None, 15 * MIN, 2 * 3600 + 10 * MIN + 15 * MIN),
        (1, 0.0, None, 0.0, 2 * 3600 + 10 * MIN),
        (1, 60 * MIN, None, 45 * MIN, 2 * 3600 + 10 * MIN + 45 * MIN),
        (1, 30 * MIN, 10 * MIN, 5 * MIN, 2 * 3600 + 10 * MIN + 5 * MIN),  # the trace's interval wins
        (1, 0.0, 20 * MIN, 5 * MIN, 2 * 3600 + 10 * MIN + 5 * MIN),  # ... also over "off"
        (2, 30 * MIN, None, 15 * MIN, 2 * 3600 + 10 * MIN + 15 * MIN),  # counted per GPU
    ],
    ids=["30m-loses-15m", "off-loses-nothing", "1h-loses-45m", "declared-10m", "declared-over-off", "2-gpus"],
)
def test_a_preemption_at_45_minutes_loses_the_work_since_the_last_checkpoint(
    gpus: int, interval: float, declared: float | None, lost_s: float, long_finish: float
) -> None:
    """A 2 h job is preempted at 45 min by a higher-priority 10-min job: it keeps the work
    up to its last checkpoint, and redoes the rest after the short job."""
    jobs = [
        job("long", 0.0, 2 * 3600, gpus=gpus, checkpoint_s=declared),
        job("short", 45 * MIN, 10 * MIN, priority=1),
    ]
    sim, result = replay(jobs, gpus=gpus, checkpoint_interval_s=interval)
    done = {o.job_id: o for o in result.outcomes}
    assert done["long"].preemptions == 1 and done["short"].first_start_s == 45 * MIN
    assert result.lost_gpu_s == {"preemption": pytest.approx(lost_s * gpus), "failure": 0.0}
    assert result.costs()["lost_gpu_h_preemption"] == pytest.approx(lost_s * gpus / 3600)
    assert done["long"].finish_s == pytest.approx(long_finish)
    assert_no_gpu_shared(sim)


def test_the_core_sees_what_the_server_records_and_the_oracle_what_is_left() -> None:
    """After the preemption the waiting request carries the wall time and GPU-time the job
    held (lost work included, as the server counts them), its declared interval, and the
    oracle's remaining work net of what was lost."""
    jobs = [
        job("long", 0.0, 2 * 3600, gpus=2, checkpoint_s=30 * MIN),
        job("short", 45 * MIN, 10 * MIN, priority=1),
    ]
    seen = []

    class Spy(type(make_policy("default"))):  # type: ignore[misc]
        def order(self, pending, ctx):  # type: ignore[no-untyped-def]
            seen.extend(j for j in pending if j.id == "long" and j.executed_s > 0)
            return super().order(pending, ctx)

    fleet = FleetSpec(nodes=1, gpus_per_node=2, nodes_per_leaf=1).build()
    Simulator(jobs, fleet, Spy(), SimConfig(restart_overhead_s=0.0, sched_interval_s=1.0)).run()
    req = seen[0]
    assert (req.executed_s, req.attained_service_s) == (45 * MIN, 2 * 45 * MIN)
    assert req.checkpoint_s == 30 * MIN
    assert req.oracle_remaining_s == pytest.approx(2 * 3600 - 30 * MIN)


def test_failures_lose_work_since_the_checkpoint_and_are_counted() -> None:
    jobs = small_trace()
    cfg = {"gpu_failures_per_gpu_day": 0.5, "node_failures_per_node_day": 0.1, "repair_s": 3600, "seed": 7}
    fleet = FleetSpec(nodes=4, gpus_per_node=8, nodes_per_leaf=2).build()
    on = Simulator(jobs, fleet, make_policy("fifo"), SimConfig(**cfg)).run()  # type: ignore[arg-type]
    off = Simulator(jobs, fleet, make_policy("fifo"), SimConfig(checkpoint_interval_s=0.0, **cfg)).run()  # type: ignore[arg-type]
    assert on.gpu_failures > 0 and on.node_failures > 0
    assert on.failures_injected == on.gpu_failures + on.node_failures
    assert on.jobs_hit_by_failures == sum(o.failures for o in on.outcomes) > 0
    assert on.lost_gpu_s["failure"] > 0 and on.lost_gpu_s["preemption"] == 0
    assert off.lost_gpu_s["failure"] == 0


@pytest.mark.parametrize("policy", ["default", "las", "fifo", "backfill"])
def test_an_arrival_at_a_finish_is_seen_by_the_pass_of_that_instant(policy: str) -> None:
    """At t=100 'running' ends and 'urgent' (higher priority) arrives while 'older' waits.
    One pass sees both: 'urgent' gets the GPU. (Before, the finish's pass gave the GPU to
    'older' and the arrival's pass then preempted it under default and las, or 'urgent'
    waited behind it under fifo and backfill.)"""
    jobs = [
        job("running", 0.0, 100.0),
        job("older", 10.0, 500.0),
        job("urgent", 100.0, 50.0, priority=1),
    ]
    sim, result = replay(jobs, policy, sched_interval_s=10.0)
    starts = {o.job_id: o.first_start_s for o in result.outcomes}
    assert starts["urgent"] == 100.0
    assert starts["older"] == 150.0
    assert result.preemptions == 0
    assert [what for _, what, job_id, _ in sim.log if job_id == "older"] == ["start", "stop"]


@pytest.mark.parametrize(
    ("limit", "abs_err", "rel_err"),
    [(100.0, 0.0, 0.0), (300.0, 200.0, (200 / 90 + 200 / 130) / 2)],
    ids=["limits-true", "limits-3x"],
)
def test_estimated_start_error_on_a_known_trace(limit: float, abs_err: float, rel_err: float) -> None:
    """One GPU, fifo: 'a' runs 100 s under a limit of ``limit``; 'b' and 'c' (50 s, limits
    50 s) arrive at 10 and 20 and are promised 'a''s limit, then 'b''s; they really start
    at 100 and 150."""
    jobs = [
        job("a", 0.0, 100.0, time_limit_s=limit),
        job("b", 10.0, 50.0, time_limit_s=50.0),
        job("c", 20.0, 50.0, time_limit_s=50.0),
    ]
    _, result = replay(jobs, "fifo", estimate_starts=True)
    assert result.first_estimates == {"b": limit, "c": limit + 50.0}
    acc = result.estimates()
    assert acc is not None
    assert (acc["started_at_once"], acc["estimated_jobs"], acc["no_estimate_jobs"]) == (1, 2, 0)
    assert acc["median_abs_error_s"] == pytest.approx(abs_err)
    assert acc["median_rel_error"] == pytest.approx(rel_err)


def test_no_estimates_unless_asked() -> None:
    _, result = replay([job("a", 0.0, 100.0), job("b", 10.0, 50.0)], "fifo")
    assert result.first_estimates is None and result.estimates() is None


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_estimating_changes_no_decision(policy: str) -> None:
    """Passes with ``explain=True`` (a new job to estimate) decide as passes without."""
    jobs = small_trace(250)
    fleet = FleetSpec(nodes=4, gpus_per_node=8, nodes_per_leaf=2).build()
    runs = [
        Simulator(jobs, fleet, make_policy(policy), SimConfig(estimate_starts=on), record=True)
        for on in (False, True)
    ]
    results = [sim.run() for sim in runs]
    assert runs[0].log == runs[1].log
    assert results[0].outcomes == results[1].outcomes
    assert results[1].first_estimates


# -- what the report says about the trace -------------------------------------------------------


def spread(n: int, days: float, gpu_h_per_job: float, start: float = 0.0) -> list[TraceJob]:
    step = days * DAY / n
    return [job(f"{start}-{i}", start + i * step, gpu_h_per_job * 3600) for i in range(n)]


@pytest.mark.parametrize(
    ("jobs", "loads"),
    [
        (spread(70, 14, 24.0), [0.5, 0.5]),  # 35 jobs x 24 GPU-h a week on 10 GPUs: 840/1680
        (spread(35, 7, 24.0) + spread(70, 7, 24.0, start=7 * DAY), [0.5, 1.0]),
        (spread(10, 3, 24.0), None),  # under a week: the load over its span
        (spread(70, 15.5, 24.0), [70 * 7 / 15.5 * 24 / 1680] * 2),  # the partial third week left out
    ],
    ids=["flat", "second-week-peak", "short-trace", "partial-week"],
)
def test_weekly_offered_load(jobs: list[TraceJob], loads: list[float] | None) -> None:
    got = weekly_loads(jobs, 10)
    if loads is None:
        span = jobs[-1].submit_s - jobs[0].submit_s
        assert got == [pytest.approx(10 * 24 * 3600 / (10 * span))]
        assert "less than a week" in trace_facts(jobs, 10, [], default_limit_s=1.0).lines()[0]
    else:
        assert got == pytest.approx(loads, rel=0.03)
        assert trace_facts(jobs, 10, [], default_limit_s=1.0).as_dict()["peak_weekly_load"] == pytest.approx(
            max(loads), rel=0.03
        )


def _cut(n_running: int) -> list[TraceJob]:
    """200 jobs; ``n_running`` of them were still running when the trace was cut at day 10
    (their end written as the cut)."""
    done = [job(f"d{i}", i * 3000.0, 1000.0 + 37 * i) for i in range(200 - n_running)]
    cut = 10 * DAY
    return done + [job(f"r{i}", cut - 5000.0 * (i + 1), 5000.0 * (i + 1)) for i in range(n_running)]


@pytest.mark.parametrize(
    ("jobs", "warned"),
    [
        (_cut(0), []),
        (_cut(8), ["end within 60 s of the trace's last end"]),
        (
            [job(f"c{i}", i * 100.0, 7 * DAY if i % 20 == 0 else 3600.0 + i) for i in range(200)],
            ["durations look capped"],
        ),
        ([job(f"c{i}", i * 100.0, 7 * DAY if i < 3 else 3600.0 + i) for i in range(200)], []),  # 3: too few
        (small_trace(), []),
    ],
    ids=["clean", "cut-while-running", "capped", "three-long-jobs", "synthetic"],
)
def test_right_censoring_warnings(jobs: list[TraceJob], warned: list[str]) -> None:
    got = censoring_warnings(jobs)
    assert len(got) == len(warned)
    for line, words in zip(got, warned, strict=True):
        assert words in line


@pytest.mark.parametrize(
    ("limits", "policies", "says"),
    [
        ([None, None], ["sjf", "las"], "FIFO with skipping"),
        ([None, 600.0], ["sjf"], "1 of 2 jobs have no time limit"),
        ([600.0, 600.0], ["sjf"], None),
        ([None, None], ["las", "default"], None),
    ],
    ids=["no-limits", "some-limits", "all-limits", "no-sjf"],
)
def test_sjf_says_what_it_is_without_limits(
    limits: list[float | None], policies: list[str], says: str | None
) -> None:
    jobs = [job(str(i), i * 10.0, 100.0, time_limit_s=lim) for i, lim in enumerate(limits)]
    notes = policy_notes(jobs, policies, default_limit_s=4 * 3600)
    if says is None:
        assert notes == {}
    else:
        assert says in notes["sjf"] and "4h00m" in notes["sjf"]


def test_the_gpufleet_csv_carries_checkpoint_intervals(tmp_path: Path) -> None:
    """Written only when a job declares one, read back exactly; 0, negative or a word is a
    skipped row with its line number."""
    jobs = [job("a", 0.0, 100.0, checkpoint_s=600.0), job("b", 1.0, 100.0)]
    path = tmp_path / "t.csv"
    write_gpufleet_csv(path, jobs)
    assert path.read_text().splitlines()[0].endswith(",checkpoint_s")
    assert load_gpufleet_csv(path).jobs == jobs
    write_gpufleet_csv(path, [jobs[1]])
    assert "checkpoint_s" not in path.read_text()
    header = path.read_text().splitlines()[0] + ",checkpoint_s"
    rows = [f"{i},u,t,{i},10,1,0,,0,,{every}" for i, every in enumerate(["0", "-5", "soon", "", "30"])]
    path.write_text("\n".join([header, *rows]) + "\n")
    load = load_gpufleet_csv(path)
    assert [j.checkpoint_s for j in load.jobs] == [None, 30.0]
    assert [p.line for p in load.problems] == [2, 3, 4]
    assert "checkpoint_s" in str(load.problems[0])
