"""A ``PlanCache`` only saves work: plans with one cache reused over many passes equal
plans rebuilt from nothing each pass, whatever the policy."""

from __future__ import annotations

import gc
import random
from dataclasses import replace

import pytest

from factories import job, node, uniform_fleet
from gpufleet.scheduler import (
    Fleet,
    Hold,
    JobRequest,
    NodeGpus,
    PlanCache,
    Quota,
    RunningJob,
    Snapshot,
    make_policy,
    plan,
)

POLICIES = ["fifo", "backfill", "las", "fairshare", "default", "sjf"]


def passes(seed: int) -> list[Snapshot]:
    """Snapshots of a changing world, as a caller keeps it: the same JobRequest and
    RunningJob objects from pass to pass while they stay; each pass starts some jobs
    (an arbitrary choice, not the plan's: both plans must agree on any input), ends
    some, adds arrivals, and twice the fleet changes (a node cordoned, then back)."""
    rng = random.Random(seed)
    gpu = uniform_fleet(6)
    base = Fleet(nodes=(*gpu.nodes, node("c1", gpus=0, pool="cpu"), node("c0", gpus=0, pool="cpu")))
    cordoned = Fleet(nodes=tuple(replace(n, schedulable=n.name != "n2") for n in base.nodes))
    fleets = [base] * 4 + [cordoned] * 3 + [base] * 3
    free = {n.name: list(range(8)) for n in gpu.nodes}
    run: list[RunningJob] = []
    pend: list[JobRequest] = []
    out: list[Snapshot] = []
    now = 0.0
    for i, f in enumerate(fleets):
        now += rng.choice([30.0, 300.0, 3600.0])
        for k in range(rng.randrange(2, 8)):
            gpus = rng.choice([0, 1, 1, 2, 4, 8, 16])
            pend.append(
                job(
                    f"p{i}-{k}",
                    gpus,
                    submit=now,
                    team=rng.choice(["a", "b", "c"]),
                    priority=rng.choice([0, 0, 1]),
                    time_limit_s=rng.choice([None, 600.0, 7200.0]),
                    pool="cpu" if gpus == 0 else "default",
                )
            )
        for rj in [r for r in run if rng.random() < 0.3]:
            run.remove(rj)
            for part in rj.placement:
                free.get(part.node, []).extend(part.gpus)
        for j in list(pend):
            on = next((n for n, g in free.items() if len(g) >= j.gpus), None) if j.gpus <= 8 else None
            if j.gpus == 0:
                on = rng.choice(["c0", "c1"])
            if on is not None and rng.random() < 0.5:
                take = tuple(sorted(free.get(on, []))[: j.gpus])
                if on in free:
                    free[on] = [g for g in free[on] if g not in take]
                pend.remove(j)
                run.append(RunningJob(job=j, placement=(NodeGpus(node=on, gpus=take),), started_at=now))
        out.append(
            Snapshot(
                now=now,
                fleet=f,
                running=tuple(run),
                pending=tuple(pend),
                quotas=(Quota(team="a", gpus=16, limit=24), Quota(team="b", gpus=8)),
                holds=(Hold(team="c", reason="held: over budget"),) if i % 3 == 2 else (),
            )
        )
    return out


@pytest.mark.parametrize("explain", [True, False], ids=["explain", "decisions"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reused_cache_gives_the_plans_of_fresh_passes(policy: str, explain: bool, seed: int) -> None:
    cache = PlanCache()
    pol = make_policy(policy)  # one object for the run, as the simulator and server keep
    for snap in passes(seed):
        fresh = plan(snap, make_policy(policy), explain=explain)
        cached = plan(snap, pol, explain=explain, cache=cache)
        again = plan(snap, pol, explain=explain, cache=cache)
        assert cached == fresh
        assert again == fresh


def test_one_cache_serves_several_fleets_and_policies() -> None:
    cache = PlanCache(max_fleets=1, max_policies=1)  # evicts at every switch
    snaps = passes(4)
    for snap in snaps + snaps[::-1]:
        for policy in ("default", "las"):
            assert plan(snap, policy, cache=cache) == plan(snap, policy)


def test_plan_keeps_no_state_without_a_cache() -> None:
    """The same snapshot twice, in between another world: the same plan."""
    snaps = passes(5)
    first = plan(snaps[-1], "default")
    for snap in snaps:
        plan(snap, "default")
    assert plan(snaps[-1], "default") == first


@pytest.mark.parametrize("enabled", [True, False], ids=["gc-on", "gc-off"])
@pytest.mark.parametrize("pause_gc", [True, False], ids=["paused", "left-alone"])
def test_pause_gc_is_the_callers_choice_and_changes_no_plan(enabled: bool, pause_gc: bool) -> None:
    snap = passes(6)[-1]
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        got = plan(snap, "default", pause_gc=pause_gc)
        assert gc.isenabled() is enabled
        assert got == plan(snap, "default")
    finally:
        (gc.enable if was else gc.disable)()
