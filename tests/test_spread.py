"""Table-driven tests of spread placement: the replicas of one service keep apart
(nodes first, then leaf switches), and share a node only when nothing else fits."""

from __future__ import annotations

import pytest

from factories import fleet, job, node, running, snapshot
from gpufleet.scheduler import plan

TWO_LEAVES = fleet(node("a1", leaf="L1"), node("a2", leaf="L1"), node("b1", leaf="L2"), node("b2", leaf="L2"))


def nodes_of(p: object) -> dict[str, str]:
    return {s.job_id: s.placement[0].node for s in p.starts}  # type: ignore[attr-defined]


CASES = [
    pytest.param(
        TWO_LEAVES,
        (),
        tuple(job(f"r{i}", 1, spread="svc") for i in range(2)),
        {"r0": "a1", "r1": "b1"},
        id="second-replica-goes-under-another-leaf",
    ),
    pytest.param(
        TWO_LEAVES,
        (),
        tuple(job(f"r{i}", 1, spread="svc") for i in range(4)),
        {"r0": "a1", "r1": "b1", "r2": "a2", "r3": "b2"},
        id="four-replicas-four-nodes",
    ),
    pytest.param(
        TWO_LEAVES,
        (running("old", {"a1": (0,)}, spread="svc"),),
        (job("new", 1, spread="svc"),),
        {"new": "b1"},
        id="a-running-replica-counts",
    ),
    pytest.param(
        TWO_LEAVES,
        (running("other", {"a1": (0,)}, spread="other-svc"),),
        (job("new", 1, spread="svc"),),
        {"new": "a1"},
        id="another-group-does-not-repel-best-fit-wins",
    ),
    pytest.param(
        fleet(node("a1", leaf="L1"), node("a2", leaf="L1")),
        (running("old", {"a1": (0,)}, spread="svc"),),
        (job("new", 1, spread="svc"),),
        {"new": "a2"},
        id="same-leaf-other-node-when-one-leaf",
    ),
    pytest.param(
        fleet(node("a1", leaf="L1"), node("a2", leaf="L1", gpus=2)),
        (running("old", {"a1": (0,)}, spread="svc"), running("fill", {"a2": (0, 1)})),
        (job("new", 1, spread="svc"),),
        {"new": "a1"},
        id="shares-a-node-only-when-nothing-else-fits",
    ),
    pytest.param(
        TWO_LEAVES,
        (),
        (job("plain", 1),),
        {"plain": "a1"},
        id="no-spread-unchanged",
    ),
]


@pytest.mark.parametrize(("f", "run", "pending", "want"), CASES)
def test_spread(f: object, run: tuple, pending: tuple, want: dict[str, str]) -> None:
    p = plan(snapshot(f, running_jobs=run, pending=pending), policy="fifo")  # type: ignore[arg-type]
    assert nodes_of(p) == want
