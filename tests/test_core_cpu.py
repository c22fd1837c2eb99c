"""0-GPU jobs and team holds, placed and explained by ``plan()`` (table-driven)."""

from __future__ import annotations

import pytest

from factories import fleet, job, node, running
from gpufleet.scheduler import (
    Fleet,
    Hold,
    JobRequest,
    Node,
    NodeGpus,
    PendingStatus,
    RunningJob,
    Snapshot,
    Status,
    plan,
)


def cpu_node(name: str, *, pool: str = "cpu", schedulable: bool = True) -> Node:
    return node(name, gpus=0, pool=pool, schedulable=schedulable)


def cpu_job(job_id: str, *, pool: str = "cpu", submit: float = 0.0, **kw: object) -> JobRequest:
    return job(job_id, 0, submit=submit, pool=pool, **kw)


def cpu_running(job_id: str, on: str, *, pool: str = "cpu", **kw: object) -> RunningJob:
    return RunningJob(
        job=cpu_job(job_id, pool=pool, **kw), placement=(NodeGpus(node=on, gpus=()),), started_at=0.0
    )


def cpu_starts(p: object) -> dict[str, str]:
    """{job: node} of the plan's 0-GPU starts."""
    return {s.job_id: s.placement[0].node for s in p.starts if not s.placement[0].gpus}  # type: ignore[attr-defined]


def snap(
    f: Fleet,
    *,
    run: tuple[RunningJob, ...] = (),
    pend: tuple[JobRequest, ...] = (),
    holds: tuple[Hold, ...] = (),
    now: float = 100.0,
) -> Snapshot:
    return Snapshot(now=now, fleet=f, running=run, pending=pend, holds=holds)


CPU = fleet(cpu_node("c2"), cpu_node("c1"), node("g1", gpus=2))

PLACEMENT = [
    pytest.param(CPU, (), (cpu_job("a"),), {"a": "c1"}, id="tie-goes-to-the-first-name"),
    pytest.param(CPU, (cpu_running("r", "c1"),), (cpu_job("a"),), {"a": "c2"}, id="fewest-running-jobs"),
    pytest.param(
        CPU,
        (),
        (cpu_job("a", submit=0), cpu_job("b", submit=1), cpu_job("c", submit=2)),
        {"a": "c1", "b": "c2", "c": "c1"},
        id="this-pass-starts-count",
    ),
    pytest.param(
        fleet(node("a1", gpus=2, pool="cpu"), cpu_node("c1")),
        (running("big", {"a1": (0, 1)}, pool="cpu"),),
        (cpu_job("a"),),
        {"a": "c1"},
        id="a-gpu-job-counts-as-one-job",
    ),
    pytest.param(
        fleet(node("g1", gpus=2, pool="cpu")),
        (),
        (cpu_job("a"),),
        {"a": "g1"},
        id="may-use-a-gpu-node-of-its-pool",
    ),
    pytest.param(
        fleet(cpu_node("c1", pool="other"), cpu_node("c2")),
        (),
        (cpu_job("a"), cpu_job("b", pool="other")),
        {"a": "c2", "b": "c1"},
        id="only-nodes-of-its-pool",
    ),
    pytest.param(
        fleet(cpu_node("c1", schedulable=False), cpu_node("c2")),
        (),
        (cpu_job("a"), cpu_job("b")),
        {"a": "c2", "b": "c2"},
        id="not-on-cordoned-nodes",
    ),
    pytest.param(
        fleet(cpu_node("c1"), cpu_node("c2")),
        (cpu_running("r", "c1"),),
        (cpu_job("low", submit=0), cpu_job("high", submit=5, priority=3)),
        {"high": "c2", "low": "c1"},
        id="priority-order-picks-first",
    ),
    pytest.param(
        fleet(cpu_node("c1"), cpu_node("c2")),
        (),
        (cpu_job("a", team="late"), cpu_job("b", team="ok")),
        {"b": "c1"},
        id="held-team-does-not-start",
    ),
]


@pytest.mark.parametrize(("f", "run", "pend", "want"), PLACEMENT)
@pytest.mark.parametrize("policy", ["fifo", "default"])
def test_cpu_jobs_go_to_the_least_loaded_node_of_their_pool(
    f: Fleet, run: tuple[RunningJob, ...], pend: tuple[JobRequest, ...], want: dict[str, str], policy: str
) -> None:
    p = plan(snap(f, run=run, pend=pend, holds=(Hold(team="late", reason="held: over budget"),)), policy)
    assert cpu_starts(p) == want
    assert all(s.placement == (NodeGpus(node=want[s.job_id], gpus=()),) for s in p.starts)
    assert not p.preemptions


NO_NODE = [
    pytest.param("x", "Unschedulable: no node in pool 'x'", id="unknown-pool"),
    pytest.param(
        "down",
        "Unschedulable: no schedulable node in pool 'down' (all cordoned or not ready)",
        id="all-cordoned",
    ),
]


@pytest.mark.parametrize(("pool", "reason"), NO_NODE)
def test_cpu_job_without_a_node_waits_with_a_reason(pool: str, reason: str) -> None:
    f = fleet(cpu_node("c1", pool="down", schedulable=False), node("g1", gpus=2))
    p = plan(snap(f, pend=(cpu_job("a", pool=pool), job("g", 1))), "default")
    assert [s.job_id for s in p.starts] == ["g"]
    assert p.pending == (
        PendingStatus(
            job_id="a", position=None, estimated_start=None, status=Status.UNSCHEDULABLE, reason=reason
        ),
    )


@pytest.mark.parametrize("policy", ["fifo", "backfill", "default"])
def test_cpu_jobs_neither_block_nor_are_blocked_by_gpu_jobs(policy: str) -> None:
    """A blocked GPU head (fifo: strict order) does not stop 0-GPU jobs; a full GPU fleet
    neither; 0-GPU jobs take no queue position from GPU jobs."""
    f = fleet(node("g1", gpus=2, pool="cpu"), cpu_node("c1"))
    run = (running("r", {"g1": (0, 1)}, pool="cpu", time_limit_s=100.0),)
    pend = (job("wide", 2, submit=0, pool="cpu"), cpu_job("a", submit=1), job("one", 1, submit=2, pool="cpu"))
    p = plan(snap(f, run=run, pend=pend), policy)
    assert cpu_starts(p) == {"a": "c1"}
    # default ranks the fresh 1-GPU job a level below the 2-GPU one (levels 2x apart); the
    # submit-ordered policies keep the wide head first: either way the CPU job takes no place
    order = ["one", "wide"] if policy == "default" else ["wide", "one"]
    assert [(w.job_id, w.position) for w in p.pending] == [(order[0], 1), (order[1], 2)]


def test_running_cpu_jobs_are_never_victims() -> None:
    """A high-priority GPU job under ``default`` preempts only what frees GPUs."""
    f = fleet(node("g1", gpus=1, pool="cpu"))
    run = (
        cpu_running("c", "g1", submit=0.0),
        running("r", {"g1": (0,)}, pool="cpu"),
    )
    p = plan(
        snap(f, run=run, pend=(job("urgent", 1, pool="cpu", priority=5, submit=50.0),), now=5000.0), "default"
    )
    assert [x.job_id for x in p.preemptions] == ["r"]


HOLDS = [
    pytest.param(
        (job("a", 1, team="late"), job("b", 1, team="ok")),
        {"b": 1},
        id="held-job-takes-no-position",
    ),
    pytest.param(
        (job("a", 4, team="ok"), job("h", 4, team="late"), job("b", 4, submit=1.0, team="ok")),
        {"a": 1, "b": 2},
        id="others-keep-their-order",
    ),
    pytest.param(
        (cpu_job("c", team="late"), job("b", 1, team="ok")),
        {"b": 1},
        id="held-cpu-job",
    ),
]


@pytest.mark.parametrize(("pend", "positions"), HOLDS)
@pytest.mark.parametrize("policy", ["fifo", "backfill", "fairshare", "default"])
def test_held_jobs_wait_with_the_hold_reason(
    pend: tuple[JobRequest, ...], positions: dict[str, int], policy: str
) -> None:
    f = fleet(node("g1", gpus=8), cpu_node("c1"))
    full = (running("r", {"g1": tuple(range(8))}, time_limit_s=100.0),)
    reason = "held: team late is over its hard budget"
    held = plan(snap(f, run=full, pend=pend, holds=(Hold(team="late", reason=reason),)), policy)
    assert not held.starts
    got = {w.job_id: w for w in held.pending}
    for j in pend:
        if j.team == "late":
            assert got[j.id] == PendingStatus(
                job_id=j.id, position=None, estimated_start=None, status=Status.UNSCHEDULABLE, reason=reason
            )
    assert {w.job_id: w.position for w in held.pending if w.position is not None} == positions
    # The others read exactly as if the held jobs were not there at all.
    others = tuple(j for j in pend if j.team != "late")
    alone = plan(snap(f, run=full, pend=others), policy)
    assert [w for w in held.pending if w.position is not None] == list(alone.pending)


def test_held_job_makes_no_shadow_reservation() -> None:
    """Under EASY backfill a blocked held head would reserve GPUs and keep a long job
    from starting; held, it reserves nothing."""
    f = fleet(node("g1", gpus=8))
    run = (running("r", {"g1": (0, 1, 2, 3)}, time_limit_s=100.0),)
    pend = (job("head", 8, team="late"), job("long", 4, submit=1.0, time_limit_s=10_000.0))
    blocked = plan(snap(f, run=run, pend=pend, now=10.0), "backfill")
    assert not blocked.starts  # the head's reservation keeps the long job out
    held = plan(snap(f, run=run, pend=pend, holds=(Hold(team="late", reason="held"),), now=10.0), "backfill")
    assert [s.job_id for s in held.starts] == ["long"]


def test_running_jobs_of_a_held_team_stay() -> None:
    f = fleet(node("g1", gpus=2))
    run = (running("r", {"g1": (0,)}, team="late"),)
    p = plan(
        snap(f, run=run, pend=(job("b", 1, team="ok"),), holds=(Hold(team="late", reason="held"),)), "default"
    )
    assert [s.job_id for s in p.starts] == ["b"]
    assert not p.preemptions
