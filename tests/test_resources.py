"""CPUs and memory next to GPUs in ``plan()`` (``scheduler/resources.py``), table-driven:
a job goes where its CPUs and memory fit, waits with a reason when no node with free
GPUs has them, is Unschedulable when no node of its pool ever could; untracked nodes
and jobs that ask nothing are never held back; 0-GPU jobs likewise."""

from __future__ import annotations

from dataclasses import replace

import pytest

from factories import job, node, running
from gpufleet.scheduler import Fleet, JobRequest, Snapshot, Status, plan


def rnode(name: str, *, cpus: int = 64, mem: int = 0, gpus: int = 8, pool: str = "default") -> object:
    return replace(node(name, gpus=gpus, pool=pool), cpus=cpus, mem_mb=mem)


def starts(p: object) -> dict[str, str]:
    return {s.job_id: s.placement[0].node for s in p.starts}  # type: ignore[attr-defined]


def reasons(p: object) -> dict[str, tuple[Status, str]]:
    return {s.job_id: (s.status, s.reason) for s in p.pending}  # type: ignore[attr-defined]


A, B = rnode("a"), rnode("b")
BUSY = running("r", {"a": (0,)}, cpus=40)  # 40 of a's 64 CPUs taken, 7 GPUs free


CASES = [
    # (name, nodes, running, pending, policy, expected starts, expected reason prefixes)
    ("fits-where-cpus-are", (A, B), (BUSY,), (job("j", 1, cpus=32),), {"j": "b"}, {}),
    ("small-enough-for-a", (A, B), (BUSY,), (job("j", 1, cpus=24),), {"j": "a"}, {}),
    ("asks-nothing-goes-anywhere", (A,), (BUSY,), (job("j", 1),), {"j": "a"}, {}),
    ("untracked-node-is-unlimited", (rnode("u", cpus=0),), (), (job("j", 1, cpus=999),), {"j": "u"}, {}),
    ("no-node-has-them-free", (A,), (BUSY,), (job("j", 1, cpus=32),), {}, {"j": "Resources: needs 32 CPUs"}),
    ("never-on-this-pool", (A, B), (), (job("j", 1, cpus=65),), {}, {"j": "Unschedulable: needs 65 CPUs"}),
    (
        "memory-too",
        (rnode("m", mem=1000),),
        (),
        (job("j", 1, mem_mb=1001),),
        {},
        {"j": "Unschedulable: needs 1001 MiB"},
    ),
    (
        "two-jobs-share-a-node",
        (A,),
        (),
        (job("j1", 1, cpus=40, submit=0), job("j2", 1, cpus=40, submit=1)),
        {"j1": "a"},
        {"j2": "Resources: needs 40 CPUs"},
    ),
    (
        "a-big-failure-does-not-skip-a-small-job",
        (A,),
        (BUSY,),
        (job("big", 1, cpus=60, submit=0), job("small", 1, cpus=8, submit=1)),
        {"small": "a"},
        {"big": "Resources"},
    ),
    (
        "cpu-jobs-least-loaded-that-fits",
        (rnode("c1", gpus=0, pool="cpu", cpus=8), rnode("c2", gpus=0, pool="cpu", cpus=32)),
        (),
        (job("p", 0, pool="cpu", cpus=16),),
        {"p": "c2"},
        {},
    ),
    (
        "cpu-job-no-room",
        (rnode("c1", gpus=0, pool="cpu", cpus=8),),
        (running("q", {"c1": ()}, pool="cpu", cpus=8),),
        (job("p", 0, pool="cpu", cpus=1),),
        {},
        {"p": "Resources: needs 1 CPUs"},
    ),
]


@pytest.mark.parametrize(
    ("nodes", "run", "pend", "want", "why"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_cpus_and_memory_decide_with_gpus(
    nodes: tuple[object, ...],
    run: tuple[object, ...],
    pend: tuple[JobRequest, ...],
    want: dict[str, str],
    why: dict[str, str],
) -> None:
    snap = Snapshot(now=10.0, fleet=Fleet(nodes=nodes), running=run, pending=pend)  # type: ignore[arg-type]
    p = plan(snap, "backfill")
    assert starts(p) == want
    got = reasons(p)
    for jid, prefix in why.items():
        assert got[jid][1].startswith(prefix), got[jid]
        if prefix.startswith("Unschedulable"):
            assert got[jid][0] is Status.UNRESOLVABLE


def test_preemption_never_oversubscribes_cpus() -> None:
    """A job that asks for CPUs waits instead of preempting (resources.py): victims'
    CPUs are not counted as freed, so a start could overcommit the node."""
    low = running("low", {"a": tuple(range(8))}, cpus=64, priority=-10)
    high = job("high", 8, cpus=32, priority=10)
    p = plan(Snapshot(now=10.0, fleet=Fleet(nodes=(A,)), running=(low,), pending=(high,)), "default")  # type: ignore[arg-type]
    assert not p.starts and not p.preemptions
