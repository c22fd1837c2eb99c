"""GPU shares in the scheduling core (``gpufleet.migindex``'s scheme, table-driven): a
shared GPU is a node of its own whose "GPUs" are its 100 units; a job asks for units by GPU
type "SHARED" on one node. A share goes where ``sharing.place``'s FGD rule puts it for the
waiting mix (best fit on ties: here, with one kind waiting, the fullest GPU that fits), is
never split across GPUs, never reaches a whole GPU, and counts in quotas and fair share as
its part of a GPU."""

from __future__ import annotations

import pytest

from factories import job, placed, running, snapshot
from gpufleet import mig
from gpufleet.scheduler import Fleet, Gpu, Node, Quota, plan, sharing
from gpufleet.scheduler.placement import share_ask

S = mig.SHARE_TAG


def _fleet(shared: int = 2) -> Fleet:
    """n1: GPU 0 whole, GPUs 1.. shared (never whole)."""
    gpus = [Gpu(index=0, model="H100-80GB")] + [
        Gpu(index=i, model="H100-80GB", healthy=False) for i in range(1, shared + 1)
    ]
    nodes = [Node(name="n1", gpus=tuple(gpus))]
    for g in range(1, shared + 1):
        units = tuple(
            Gpu(index=mig.share_index(g, u), model=mig.share_model("H100-80GB"), nvlink_domain=g)
            for u in range(mig.SHARE_UNITS)
        )
        nodes.append(Node(name=mig.share_node("n1", g), gpus=units))
    return Fleet(nodes=tuple(nodes))


def _units(p: object, job_id: str) -> tuple[str, int]:
    [(node, gpus)] = placed(p.starts)[job_id].items()  # type: ignore[attr-defined]
    return node, len(gpus)


@pytest.mark.parametrize(
    ("held", "units", "node"),
    [
        ({}, 25, "n1:share1"),  # both untouched: the first
        ({"n1:share2": 40}, 25, "n1:share2"),  # pack onto the GPU already shared
        ({"n1:share2": 80}, 25, "n1:share1"),  # it has no room left for 25
        ({"n1:share1": 10, "n1:share2": 70}, 30, "n1:share2"),  # the fullest that fits
        ({"n1:share1": 10, "n1:share2": 70}, 31, "n1:share1"),
    ],
)
def test_shares_go_to_the_fullest_shared_gpu_that_fits(held: dict[str, int], units: int, node: str) -> None:
    busy = tuple(
        running(
            f"r{i}",
            {n: tuple(range(mig.share_index(int(n[-1]), 0), mig.share_index(int(n[-1]), k)))},
            gpu_type=S,
        )
        for i, (n, k) in enumerate(held.items())
    )
    p = plan(
        snapshot(_fleet(), running_jobs=busy, pending=(job("j", units, gpu_type=S, nodes=1),)), "default"
    )
    assert _units(p, "j") == (node, units)


@pytest.mark.parametrize(
    ("held", "pending"),
    [
        ({"n1:share1": 40, "n1:share2": 75}, (20, 25)),
        ({"n1:share1": 70, "n1:share2": 10}, (30, 60, 90)),
        ({"n1:share2": 50}, (50, 50, 100)),
        ({"n1:share1": 95, "n1:share2": 95}, (5, 10)),
    ],
)
def test_the_core_places_a_share_where_fgd_does(held: dict[str, int], pending: tuple[int, ...]) -> None:
    """The core's choice for the first waiting share is ``sharing.place``'s ``fgd`` choice
    over the same shared GPUs for the same waiting mix: one rule, the one
    ``bench/bench_sharing.py`` measures (its own table tests: ``tests/test_sharing.py``)."""
    busy = tuple(
        running(f"r{n}", {n: tuple(mig.share_index(int(n[-1]), u) for u in range(k))}, gpu_type=S)
        for n, k in held.items()
    )
    jobs = tuple(job(f"j{i}", u, gpu_type=S, nodes=1, submit=float(i)) for i, u in enumerate(pending))
    p = plan(snapshot(_fleet(), running_jobs=busy, pending=jobs), "fifo")
    free = [[(100 - held.get(f"n1:share{g}", 0)) * 10 for g in (1, 2)]]
    frag = sharing.Fragmentation(sharing.mix_of(share_ask(u) for u in pending))
    want = sharing.place(sharing.Shares(names=["n1"], free=free), share_ask(pending[0]), "fgd", frag)
    assert want is not None
    assert _units(p, "j0") == (f"n1:share{want.gpus[0] + 1}", pending[0])


def test_whole_jobs_never_get_a_shared_gpu_and_shares_never_a_whole_one() -> None:
    p = plan(
        snapshot(_fleet(), pending=(job("w", 2), job("one", 1), job("s", 100, gpu_type=S, nodes=1))),
        "default",
    )
    assert placed(p.starts)["one"] == {"n1": (0,)}
    assert _units(p, "s") == ("n1:share1", 100)
    assert "w" not in placed(p.starts)


def test_a_share_larger_than_a_gpu_can_never_fit() -> None:
    p = plan(snapshot(_fleet(), pending=(job("j", 120, gpu_type=S, nodes=1),)), "default")
    [why] = [w.reason for w in p.pending if w.job_id == "j"]
    assert "more than a H100-80GB SHARED GPU has" in why


def test_quotas_count_a_share_as_its_part_of_a_gpu() -> None:
    """A team limited to 1 GPU runs four quarter shares (1 GPU in all); the fifth waits,
    and the reason says how much the team holds in GPUs, not units."""
    pending = tuple(job(f"q{i}", 25, gpu_type=S, nodes=1, team="t", submit=float(i)) for i in range(5))
    p = plan(snapshot(_fleet(), pending=pending, quotas=(Quota(team="t", gpus=1, limit=1),)), "default")
    assert sorted(placed(p.starts)) == ["q0", "q1", "q2", "q3"]
    [why] = [w.reason for w in p.pending if w.job_id == "q4"]
    assert "holds 1 of its 1-GPU limit, job needs 0.25" in why


def test_a_share_job_weighs_its_part_of_a_gpu() -> None:
    assert job("s", 25, gpu_type=S).gpu_weight == 0.25
    assert job("h", 25, gpu_type="H100 SHARED").units == mig.SHARE_UNITS
    assert job("w", 3).gpu_weight == 3 and job("m", 2, gpu_type="MIG 1g.10gb").gpu_weight == 2
