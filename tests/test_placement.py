"""Table-driven tests of topology-aware gang placement (the plan's starts)."""

from __future__ import annotations

import gc
import random

import pytest

from factories import fleet, job, node, placed, running, snapshot, uniform_fleet
from gpufleet.scheduler import Fleet, RunningJob, Status, plan
from gpufleet.scheduler.capacity import FleetIndex

ALL8 = tuple(range(8))

CASES = [
    pytest.param(
        fleet(node("a"), node("b")),
        (running("r", {"a": (0, 1, 2, 3, 4)}),),
        job("j", 2),
        {"j": {"a": (5, 6)}},
        id="best-fit-fills-the-busiest-node",
    ),
    pytest.param(
        fleet(node("a", domains=2)),
        (running("r", {"a": (0,)}),),
        job("j", 4),
        {"j": {"a": (4, 5, 6, 7)}},
        id="stays-inside-one-nvlink-domain",
    ),
    pytest.param(
        fleet(node("a", domains=2)),
        (running("r", {"a": (0, 4)}),),
        job("j", 4),
        {"j": {"a": (1, 2, 3, 5)}},
        id="spans-fewest-domains-when-none-fits",
    ),
    pytest.param(
        fleet(
            node("a", leaf="L1", rack="R1"),
            node("b", leaf="L2", rack="R1"),
            node("c", leaf="L2", rack="R1"),
        ),
        (),
        job("j", 16),
        {"j": {"b": ALL8, "c": ALL8}},
        id="gang-under-one-leaf",
    ),
    pytest.param(
        fleet(
            node("a", leaf="L1", rack="R1"),
            node("b", leaf="L2", rack="R2"),
            node("c", leaf="L3", rack="R2"),
        ),
        (),
        job("j", 16),
        {"j": {"b": ALL8, "c": ALL8}},
        id="gang-inside-one-rack-when-no-leaf-holds-it",
    ),
    pytest.param(
        uniform_fleet(2),
        (),
        job("j", 12),
        {"j": {"n0": ALL8, "n1": (0, 1, 2, 3)}},
        id="twelve-gpus-take-fewest-nodes",
    ),
    pytest.param(
        uniform_fleet(2),
        (),
        job("j", 4, gpus_per_node=2),
        {"j": {"n0": (0, 1), "n1": (0, 1)}},
        id="pinned-gpus-per-node",
    ),
    pytest.param(
        fleet(node("a", model="A100"), node("h", model="H100")),
        (),
        job("j", 8, gpu_type="H100"),
        {"j": {"h": ALL8}},
        id="gpu-type-constraint",
    ),
    pytest.param(
        fleet(node("a", model="NVIDIA H100 80GB HBM3")),
        (),
        job("j", 1, gpu_type="h100"),
        {"j": {"a": (0,)}},
        id="gpu-type-matches-nvml-name",
    ),
    pytest.param(
        fleet(node("a", unhealthy=(0, 1)), node("b", schedulable=False)),
        (),
        job("j", 6),
        {"j": {"a": (2, 3, 4, 5, 6, 7)}},
        id="skips-unhealthy-gpus-and-cordoned-nodes",
    ),
]


@pytest.mark.parametrize(("f", "run", "want_job", "want"), CASES)
def test_placement(f, run, want_job, want) -> None:  # type: ignore[no-untyped-def]
    got = plan(snapshot(f, running_jobs=run, pending=(want_job,)), "fifo")
    assert placed(got.starts) == want


WAITS = [
    pytest.param(
        uniform_fleet(2),
        (running("r", {"n0": (0, 1, 2, 3)}),),
        job("j", 16),
        Status.UNSCHEDULABLE,
        "Resources: needs 16 GPUs on 2 nodes (8 per node), largest free block 8, 12 H100 GPUs free",
        id="gang-waits-for-whole-nodes",
    ),
    pytest.param(
        fleet(node("a", model="A100"), node("h", model="H100")),
        (),
        job("j", 16),
        Status.UNRESOLVABLE,
        "Unschedulable: needs 16 GPUs on 2 nodes (8 per node), pool default has 8 H100 GPUs",
        id="never-mixes-models",
    ),
    pytest.param(
        uniform_fleet(1),
        (),
        job("j", 1, pool="cpu"),
        Status.UNRESOLVABLE,
        "Unschedulable: unknown pool cpu",
        id="unknown-pool",
    ),
    pytest.param(
        uniform_fleet(1),
        (),
        job("j", 1, gpu_type="B200"),
        Status.UNRESOLVABLE,
        "Unschedulable: no schedulable B200 GPUs in pool default (its GPU models: H100)",
        id="unknown-model",
    ),
    pytest.param(
        uniform_fleet(2),
        (),
        job("j", 6, gpus_per_node=4),
        Status.UNRESOLVABLE,
        "Unschedulable: 6 GPUs do not split into 4 per node",
        id="uneven-pinned-split",
    ),
]


@pytest.mark.parametrize(("f", "run", "waiting", "status", "reason"), WAITS)
def test_wait_reasons(f, run, waiting, status, reason) -> None:  # type: ignore[no-untyped-def]
    got = plan(snapshot(f, running_jobs=run, pending=(waiting,)), "fifo")
    assert got.starts == ()
    (ps,) = got.pending
    assert (ps.status, ps.reason) == (status, reason)


def test_fragmentation_counts_free_gpus_too_scattered_for_the_head_job() -> None:
    # 4 free on n0, 4 free on n1, 8 free on n2; head needs 16 on 2 nodes -> the 8
    # scattered GPUs cannot host any of its 8-GPU parts: 8 of 16 free are fragmented.
    f = uniform_fleet(3)
    run = (running("r0", {"n0": (0, 1, 2, 3)}), running("r1", {"n1": (0, 1, 2, 3)}))
    got = plan(snapshot(f, running_jobs=run, pending=(job("wide", 16),)), "fifo")
    assert got.starts == ()
    assert got.fragmentation == pytest.approx(0.5)
    assert got.free_gpus == 16


def test_same_snapshot_same_plan() -> None:
    f = uniform_fleet(6)
    pend = tuple(job(f"j{i}", [1, 2, 4, 8, 16][i % 5], submit=i) for i in range(40))
    run = (running("r", {"n0": (0, 1, 2)}, time_limit_s=50.0),)
    plans = [
        plan(snapshot(f, running_jobs=run, pending=pend), name)
        for name in ("backfill", "default")
        for _ in range(2)
    ]
    assert plans[0] == plans[1]
    assert plans[2] == plans[3]


def _recount(f: Fleet, run: tuple[RunningJob, ...]) -> tuple[list[int], dict[int, dict[int, int]]]:
    occ = FleetIndex(f).occupancy(run)  # a fresh index: counted from scratch
    return occ.free, {n: h for n, h in occ.used.items() if h}


def test_occupancy_derived_pass_after_pass_equals_a_recount() -> None:
    """Removals, appends, reorders, a job twice and a wholesale change: the occupancy
    derived from the last pass's (capacity.py) always matches counting afresh."""
    rng = random.Random(5)
    f = uniform_fleet(6)
    index = FleetIndex(f)
    pool = [running(f"r{i}", {f"n{i % 6}": (i % 8,)}, started=float(i)) for i in range(48)]
    run: tuple[RunningJob, ...] = tuple(pool[:20])
    for step in range(200):
        what = step % 5
        jobs = list(run)
        if what == 0 and jobs:  # a few finish
            for _ in range(min(len(jobs), rng.randint(1, 3))):
                jobs.pop(rng.randrange(len(jobs)))
        elif what == 1:  # a few start, appended
            jobs += rng.sample([r for r in pool if all(r is not j for j in jobs)], k=2)
        elif what == 2:
            rng.shuffle(jobs)
        elif what == 3 and jobs:
            jobs.append(jobs[0])  # the same object twice
        elif what == 4:
            jobs = rng.sample(pool, k=rng.randint(0, 30))
        run = tuple(jobs)
        occ = index.occupancy(run)
        assert (occ.free, {n: h for n, h in occ.used.items() if h}) == _recount(f, run), step
        if what == 3:
            run = run[:-1]


@pytest.mark.parametrize("enabled", [True, False], ids=["gc-on", "gc-off"])
def test_a_pass_leaves_the_garbage_collector_as_it_found_it(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        plan(snapshot(uniform_fleet(2), pending=(job("j", 2),)), "default")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
