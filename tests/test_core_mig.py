"""MIG slices in the scheduling core (``gpufleet.mig``'s scheme, table-driven): a node's
slices of one profile are a node of their own whose GPUs are the slices; a job asks for
them by GPU type "MIG <profile>". Whole-GPU jobs never get a slice, slice jobs never get a
whole GPU, a job's slices are on one node, and a job that can never have its slices says
which profile."""

from __future__ import annotations

import pytest

from factories import job, placed, snapshot
from gpufleet import mig
from gpufleet.scheduler import Fleet, Gpu, Node, plan


def _fleet() -> Fleet:
    """n1: GPU 0 whole, GPU 1 in MIG mode (never whole) cut in 1g.10gb x3 + 2g.20gb x2."""
    whole = Node(
        name="n1",
        gpus=(
            Gpu(index=0, model="H100-80GB"),
            Gpu(index=1, model="H100-80GB", healthy=False),
        ),
    )
    ones = Node(
        name=mig.slice_node("n1", "1g.10gb"),
        gpus=tuple(
            Gpu(index=mig.slice_index(1, s), model=mig.slice_model("H100-80GB", "1g.10gb")) for s in (4, 5, 6)
        ),
    )
    twos = Node(
        name=mig.slice_node("n1", "2g.20gb"),
        gpus=tuple(
            Gpu(index=mig.slice_index(1, s), model=mig.slice_model("H100-80GB", "2g.20gb")) for s in (0, 2)
        ),
    )
    return Fleet(nodes=(whole, ones, twos))


@pytest.mark.parametrize(
    ("gpus", "gpu_type", "where"),
    [
        (1, None, {"n1": (0,)}),
        (1, "H100", {"n1": (0,)}),
        (1, "MIG 1g.10gb", {"n1:1g.10gb": (1036,)}),
        (3, "MIG 1g.10gb", {"n1:1g.10gb": (1036, 1037, 1038)}),
        (2, "MIG 2g.20gb", {"n1:2g.20gb": (1032, 1034)}),
        (1, "H100-80GB MIG 2g.20gb", {"n1:2g.20gb": (1032,)}),
    ],
)
def test_slices_and_whole_gpus_go_to_their_own_kind(
    gpus: int, gpu_type: str | None, where: dict[str, tuple[int, ...]]
) -> None:
    p = plan(snapshot(_fleet(), pending=(job("j", gpus, gpu_type=gpu_type, nodes=1),)), "default")
    assert placed(p.starts) == {"j": where}


@pytest.mark.parametrize(
    ("gpus", "gpu_type", "words"),
    [
        (2, None, "GPU"),  # one whole GPU: the MIG GPU is never whole
        (4, "MIG 1g.10gb", "1g.10gb"),
        (1, "MIG 3g.40gb", "MIG 3g.40gb"),
    ],
)
def test_what_can_never_fit_says_so(gpus: int, gpu_type: str | None, words: str) -> None:
    p = plan(snapshot(_fleet(), pending=(job("j", gpus, gpu_type=gpu_type, nodes=1),)), "default")
    assert not p.starts
    (status,) = p.pending
    assert status.reason is not None and words in status.reason, status.reason


def test_wants_slices_reads_the_gpu_type() -> None:
    assert mig.wants_slices("MIG 1g.10gb") and mig.wants_slices("h100-mig-1g.10gb")
    assert not mig.wants_slices("H100") and not mig.wants_slices(None) and not mig.wants_slices("migration")
    assert mig.slice_of(mig.slice_index(3, 5)) == (3, 5) and mig.slice_of(7) is None
    assert mig.device_gpu(mig.slice_index(3, 5)) == 3 and mig.device_gpu(2) == 2
    assert mig.physical_node(mig.slice_node("n7", "3g.40gb")) == "n7" and mig.physical_node("n7") == "n7"
    with pytest.raises(ValueError):
        mig.slice_index(0, 8)
