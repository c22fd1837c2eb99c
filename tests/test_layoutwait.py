"""``layoutwait``'s pure parts as tables: which slice jobs a pending MIG layout holds
back, and in what words (the server's black-box test is tests/server/test_mig_wait.py)."""

from __future__ import annotations

import pytest

from gpufleet.scheduler import Blocked, Fleet, Gpu, JobRequest, Node
from gpufleet.server.services.layoutwait import CODE, Awaited, judge, reason

SEVEN = ("1g.10gb",) * 7


def awaited() -> Awaited:
    """Node n7 will have 1g.10gb x7 on GPU 4 (nothing else of that profile)."""
    return Awaited(node="n7", pool="default", model="H100-80GB", future={"1g.10gb": 7}, pending=((4, SEVEN),))


def job(
    gpu_type: str | None = "MIG 1g.10gb", gpus: int = 2, pool: str = "default", jid: str = "1"
) -> JobRequest:
    return JobRequest(id=jid, gpus=gpus, submit_time=0.0, gpu_type=gpu_type, pool=pool)


def slice_node(profile: str, count: int, *, healthy: bool = True) -> Node:
    gpus = tuple(
        Gpu(
            index=1024 + i,
            model=f"H100-80GB MIG {profile}",
            memory_mb=10_240,
            nvlink_domain=0,
            healthy=healthy,
        )
        for i in range(count)
    )
    return Node(name=f"n1:{profile}", gpus=gpus, leaf="l", rack="r", pool="default")


WAITS = "waiting for n7's MIG layout (1g.10gb x7) to take effect"


@pytest.mark.parametrize(
    ("pending", "fleet", "want"),
    [
        ([job()], Fleet(nodes=()), {1: WAITS}),
        ([job(gpu_type="H100 MIG 1g.10gb")], Fleet(nodes=()), {1: WAITS}),
        ([job(gpus=8)], Fleet(nodes=()), {}),  # more than the layout makes on one node
        ([job(gpu_type="MIG 2g.20gb")], Fleet(nodes=()), {}),  # not a profile it makes
        ([job(pool="other")], Fleet(nodes=()), {}),  # another pool's layout
        ([job(gpu_type=None)], Fleet(nodes=()), {}),  # whole GPUs never wait for a layout
        ([job()], Fleet(nodes=(slice_node("1g.10gb", 2),)), {}),  # a live node can take it
        ([job()], Fleet(nodes=(slice_node("1g.10gb", 1),)), {1: WAITS}),  # too few live ones
        ([job()], Fleet(nodes=(slice_node("1g.10gb", 7, healthy=False),)), {1: WAITS}),  # cordoned
    ],
    ids=[
        "waits",
        "model-and-profile",
        "too-many",
        "other-profile",
        "other-pool",
        "whole",
        "live-fits",
        "live-too-few",
        "live-cordoned",
    ],
)
def test_judge(pending: list[JobRequest], fleet: Fleet, want: dict[int, str]) -> None:
    held = judge(pending, fleet=fleet, awaited=[awaited()])
    assert {jid: b.detail for jid, b in held.items()} == want
    assert all(b.code == CODE for b in held.values())


def test_nothing_pending_holds_nothing_and_a_blocked_job_keeps_its_reason() -> None:
    assert judge([job()], fleet=Fleet(nodes=()), awaited=[]) == {}
    dep = JobRequest(
        id="2",
        gpus=1,
        submit_time=0.0,
        gpu_type="MIG 1g.10gb",
        blocked=Blocked(code="Dependency", detail="x"),
    )
    assert judge([dep], fleet=Fleet(nodes=()), awaited=[awaited()]) == {}


def test_the_reason_names_every_layout_that_makes_the_profile() -> None:
    two = Awaited(
        node="n7",
        pool="default",
        model="H100-80GB",
        future={"1g.10gb": 9, "3g.40gb": 1},
        pending=((4, SEVEN), (5, ("1g.10gb", "1g.10gb", "3g.40gb"))),
    )
    assert reason([two], pool="default", gpu_type="MIG 1g.10gb", gpus=9) == (
        "waiting for n7's MIG layout (1g.10gb x7 and 1g.10gb x2, 3g.40gb) to take effect"
    )
    assert reason([two], pool="default", gpu_type="MIG 3g.40gb", gpus=1) == (
        "waiting for n7's MIG layout (1g.10gb x2, 3g.40gb) to take effect"
    )
    assert reason([two], pool="default", gpu_type="MIG 3g.40gb", gpus=2) is None
