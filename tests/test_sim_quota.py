"""Team quotas and holds reach the core in every simulated pass (SimConfig and
``gpufleet simulate --quota``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.scheduler import Hold, Quota, make_policy
from gpufleet.sim import FleetSpec, SimConfig, Simulator, TraceJob
from gpufleet.sim.loaders.gpufleet_csv import write_gpufleet_csv
from gpufleet.sim.synth import synthesize

FLEET = FleetSpec(nodes=4, gpus_per_node=8, nodes_per_leaf=2)


def trace(n: int = 300) -> list[TraceJob]:
    return synthesize(jobs=n, seed=7, load=1.2, nodes=FLEET.nodes, gpus_per_node=FLEET.gpus_per_node, teams=2)


def peak_gpus(sim: Simulator, team: str, jobs: list[TraceJob]) -> int:
    """The most GPUs ``team`` held at once, from the start/stop log."""
    team_of = {j.job_id: j.team for j in jobs}
    held = peak = 0
    for _, what, job_id, placement in sim.log:
        if team_of[job_id] != team:
            continue
        n = sum(len(p.gpus) for p in placement)
        held += n if what == "start" else -n
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("policy", ["fifo", "backfill", "las", "fairshare", "default"])
def test_a_hard_quota_caps_the_team_in_every_pass(policy: str) -> None:
    jobs = [j for j in trace() if j.gpus <= 8]
    team = jobs[0].team
    free = Simulator(jobs, FLEET.build(), make_policy(policy), SimConfig(), record=True)
    free.run()
    assert peak_gpus(free, team, jobs) > 8  # the cap below binds
    capped = Simulator(
        jobs,
        FLEET.build(),
        make_policy(policy),
        SimConfig(quotas=(Quota(team=team, gpus=8, limit=8),)),
        record=True,
    )
    result = capped.run()
    assert peak_gpus(capped, team, jobs) <= 8
    assert len(result.outcomes) == len(jobs)  # capped, not starved


def test_fair_share_weights_come_from_the_quotas() -> None:
    jobs = trace()
    teams = sorted({j.team for j in jobs})
    even = Simulator(jobs, FLEET.build(), make_policy("fairshare"), SimConfig()).run()
    skewed = Simulator(
        jobs,
        FLEET.build(),
        make_policy("fairshare"),
        SimConfig(quotas=(Quota(team=teams[0], gpus=28), Quota(team=teams[1], gpus=4))),
    ).run()

    def avg_queue(result: object, team: str) -> float:
        rows = [o.queue_s for o in result.outcomes if o.job_id in {j.job_id for j in jobs if j.team == team}]  # type: ignore[attr-defined]
        return sum(rows) / len(rows)

    assert avg_queue(skewed, teams[0]) < avg_queue(even, teams[0])
    assert avg_queue(skewed, teams[1]) > avg_queue(even, teams[1])


@pytest.mark.parametrize("policy", ["fifo", "default"])
def test_a_held_team_never_runs_and_the_run_ends(policy: str) -> None:
    jobs = trace(120)
    team = jobs[0].team
    cfg = SimConfig(holds=(Hold(team=team, reason="held"),), gpu_failures_per_gpu_day=0.5)
    result = Simulator(jobs, FLEET.build(), make_policy(policy), cfg).run()
    assert {o.job_id for o in result.outcomes} == {j.job_id for j in jobs if j.team != team}


def gpufleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_simulate_takes_quotas(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    write_gpufleet_csv(path, trace(60))
    out = tmp_path / "s.json"
    ran = gpufleet(
        "simulate", "--trace", str(path), "--nodes", "4", "--policy", "fairshare",
        "--quota", "team-0=24", "--quota", "team-1=8:16", "--json", str(out),
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert json.loads(out.read_text())["config"]["quotas"] == {
        "team-0": {"gpus": 24, "limit": None},
        "team-1": {"gpus": 8, "limit": 16},
    }


@pytest.mark.parametrize(
    "value",
    ["team-0", "team-0=x", "=8", "team-0=8:y", "team-0=-1"],
    ids=["no-amount", "not-a-number", "no-team", "bad-limit", "negative"],
)
def test_simulate_refuses_a_bad_quota(tmp_path: Path, value: str) -> None:
    ran = gpufleet("simulate", "--sample", "--max-jobs", "5", "--policy", "fifo", "--quota", value)
    assert ran.returncode == 2
    assert "--quota" in ran.stderr


def test_a_job_over_its_teams_hard_limit_is_rejected_not_waited_on() -> None:
    jobs = [j for j in trace(80) if j.gpus <= 8]
    team = next(j.team for j in jobs if j.gpus == 8)
    cfg = SimConfig(quotas=(Quota(team=team, gpus=4, limit=4),))
    result = Simulator(jobs, FLEET.build(), make_policy("default"), cfg).run()  # ends: nothing waits for ever
    too_big = {j.job_id for j in jobs if j.team == team and j.gpus > 4}
    assert {jid for jid, _ in result.rejected} == too_big
    assert all("hard limit of 4" in why for _, why in result.rejected)
    assert len(result.outcomes) == len(jobs) - len(too_big)
