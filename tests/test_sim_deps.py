"""The simulator judges dependencies with the server's rules (``scheduler/deps.py``):
an afterok job starts only after its predecessor completed, an afternotok one whose
predecessor succeeded is rejected (a replay must end), and the gpufleet CSV carries
an optional ``dependency`` column both ways."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.scheduler import make_policy
from gpufleet.sim import FleetSpec, SimConfig, Simulator, TraceJob
from gpufleet.sim.loaders.gpufleet_csv import load_gpufleet_csv, write_gpufleet_csv

FLEET = FleetSpec(nodes=2, gpus_per_node=8, nodes_per_leaf=2)


def tj(
    job_id: str, submit: float, duration: float, gpus: int = 1, dep: str | None = None, **kw: object
) -> TraceJob:
    return TraceJob(
        job_id=job_id,
        user="u",
        team="t",
        submit_s=submit,
        duration_s=duration,
        gpus=gpus,
        dependency=dep,
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("policy", ["fifo", "backfill", "las"])
def test_dependencies_order_jobs_on_an_idle_fleet(policy: str) -> None:
    jobs = [
        tj("1", 0, 100),  # preprocess
        tj("2", 0, 50, dep="afterok:1"),  # train after it
        tj("3", 1, 10, dep="afterany:2?after:9"),  # 9 comes later: either will do
        tj("4", 2, 10, dep="afternotok:1"),  # 1 succeeds: never
        tj("5", 3, 10, dep="afterok:1,afterok:77"),  # 77 is not in the trace: never
        tj("6", 0, 500, time_limit_s=60),  # times out
        tj("7", 5, 10, dep="afterok:6"),  # never: 6 times out
        tj("8", 5, 10, dep="afternotok:6"),
        tj("9", 400, 10),
    ]
    sim = Simulator(jobs, FLEET.build(), make_policy(policy), SimConfig(restart_overhead_s=0))
    out = {o.job_id: o for o in sim.run().outcomes}
    rejected = dict(sim.rejected)
    assert out["2"].first_start_s >= out["1"].finish_s == pytest.approx(100.0, abs=0.2)
    assert out["3"].first_start_s >= out["2"].finish_s
    assert out["8"].first_start_s >= out["6"].finish_s
    assert set(rejected) == {"4", "5", "7"}
    assert all(why.startswith("DependencyNeverSatisfied") for why in rejected.values())


def test_a_bad_dependency_in_a_trace_is_rejected_with_its_words() -> None:
    sim = Simulator([tj("1", 0, 10, dep="after:x")], FLEET.build(), make_policy("fifo"), SimConfig())
    sim.run()
    assert "not a job id" in dict(sim.rejected)["1"]


def test_the_gpufleet_csv_round_trips_dependencies(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    jobs = [tj("1", 0, 10), tj("2", 1, 10, dep="afterok:1")]
    write_gpufleet_csv(path, jobs)
    assert path.read_text().splitlines()[0].endswith(",dependency")
    assert [j.dependency for j in load_gpufleet_csv(path).jobs] == [None, "afterok:1"]
    write_gpufleet_csv(path, [tj("1", 0, 10)])
    assert not path.read_text().splitlines()[0].endswith(",dependency")
