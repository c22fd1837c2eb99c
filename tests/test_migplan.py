"""The MIG planner (``scheduler/migplan.py``), pure: which idle GPUs get which layout for
the jobs that wait, and which GPUs are never touched. Tables of name / input / want."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet import mig
from gpufleet.scheduler.migplan import MigGpu, Relayout, Waiting, fits, pack, plan_layouts, profile_of

NOW = 10_000.0
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
ONE_G = ("1g.10gb",) * 7


def gpu(node: str, index: int, *layout: str, pool: str = "p", model: str = H100, **kw: Any) -> MigGpu:
    """A GPU in MIG mode with ``layout``, idle and in service unless ``kw`` says otherwise."""
    kw = {"mig_enabled": True, **kw}
    return MigGpu(node=node, index=index, pool=pool, model=model, layout=layout, **kw)


def whole(node: str, index: int, *, pool: str = "p", **kw: Any) -> MigGpu:
    """A GPU with MIG mode off."""
    return MigGpu(node=node, index=index, pool=pool, model=H100, mig_enabled=False, **kw)


def wait(gpu_type: str | None, gpus: int = 1, *, pool: str = "p") -> Waiting:
    return Waiting(pool=pool, gpu_type=gpu_type, gpus=gpus)


def slices(profile: str, n: int = 1, *, pool: str = "p") -> Waiting:
    return wait(mig.slice_gpu_type(profile), n, pool=pool)


def relayout(node: str, index: int, layout: tuple[str, ...], reason: str) -> Relayout:
    return Relayout(node=node, index=index, layout=layout, reason=reason)


CASES = [
    pytest.param(
        [slices("1g.10gb", 2)],
        [gpu("n1", 0, "7g.80gb")],
        [relayout("n1", 0, ONE_G, "2 1g.10gb slices waiting")],
        id="slices-wait-an-idle-7g-becomes-seven-1g",
    ),
    pytest.param(
        [slices("1g.10gb", 2), slices("3g.40gb")],
        [gpu("n1", 0)],
        [
            relayout(
                "n1",
                0,
                ("3g.40gb", *("1g.10gb",) * 4),
                "1 3g.40gb slice, 2 1g.10gb slices waiting",
            )
        ],
        id="largest-first-then-the-most-wanted-fills-the-room",
    ),
    pytest.param(
        [slices("1g.10gb", 2), wait(None, 1)],
        [gpu("n1", 0, "7g.80gb"), whole("n1", 1, held=True)],
        [],
        id="whole-gpus-wait-too-nothing",
    ),
    pytest.param([], [gpu("n1", 0, "7g.80gb")], [], id="nothing-waits-nothing"),
    pytest.param(
        [slices("1g.10gb", 3)],
        [gpu("n1", 0, *ONE_G, held=True), gpu("n1", 1, "3g.40gb", "3g.40gb")],
        [relayout("n1", 1, ONE_G, "3 1g.10gb slices waiting")],
        id="a-busy-gpu-of-that-profile-another-idle-one-is-cut",
    ),
    pytest.param(
        [slices("1g.10gb", 3)],
        [gpu("n1", 0, *ONE_G), gpu("n1", 1, "7g.80gb")],
        [],
        id="idle-slices-of-that-profile-cover-it",
    ),
    pytest.param(
        [slices("1g.10gb", 9)],
        [gpu("n1", 0, "3g.40gb", "1g.10gb", "1g.10gb"), gpu("n1", 1, "7g.80gb")],
        [relayout("n1", 1, ONE_G, "7 1g.10gb slices waiting")],
        id="a-gpu-that-serves-the-profile-is-not-cut-the-rest-is",
    ),
    pytest.param(
        [slices("1g.10gb", 3)],
        [gpu("n1", 0, "7g.80gb", pending=ONE_G), gpu("n1", 1, "7g.80gb")],
        [],
        id="a-pending-layout-covers-it",
    ),
    pytest.param(
        [slices("1g.10gb", 10)],
        [gpu("n1", 0, "7g.80gb", pending=ONE_G), gpu("n1", 1, "7g.80gb")],
        [relayout("n1", 1, ONE_G, "3 1g.10gb slices waiting")],
        id="a-pending-layout-counts-and-the-rest-is-cut",
    ),
    pytest.param(
        [slices("1g.10gb", 28)],
        [gpu("n1", i, "7g.80gb") for i in range(4)],
        [
            relayout("n1", 0, ONE_G, "28 1g.10gb slices waiting"),
            relayout("n1", 1, ONE_G, "21 1g.10gb slices waiting"),
        ],
        id="at-most-max-changes",
    ),
    pytest.param(
        [slices("1g.10gb", 5)],
        [gpu("n1", 0, "7g.80gb"), gpu("n1", 1, "7g.80gb")],
        [relayout("n1", 0, ONE_G, "5 1g.10gb slices waiting")],
        id="only-as-many-gpus-as-the-demand-needs",
    ),
    pytest.param(
        [slices("1g.10gb")],
        [gpu("n1", 0, "7g.80gb", model="Tesla T4")],
        [],
        id="a-model-without-mig-profiles",
    ),
    pytest.param(
        [slices("1g.5gb")],
        [gpu("n1", 0, "7g.80gb")],
        [],
        id="a-profile-of-another-model",
    ),
    pytest.param(
        [wait("A100 MIG 1g.10gb", 2)],
        [gpu("a1", 0, "7g.80gb", model=A100), gpu("h1", 0, "7g.80gb")],
        [relayout("a1", 0, ONE_G, "2 1g.10gb slices waiting")],
        id="a-slice-ask-naming-a-model-gets-that-model",
    ),
    pytest.param(
        [slices("1g.10gb", 2), wait("SHARED", 25), wait("A100", 1)],
        [gpu("n1", 0, "7g.80gb")],
        [relayout("n1", 0, ONE_G, "2 1g.10gb slices waiting")],
        id="shares-and-models-the-pool-lacks-are-no-whole-demand",
    ),
    # -- back to whole ----------------------------------------------------------------
    pytest.param(
        [wait(None, 2)],
        [gpu("n1", 0, *ONE_G), gpu("n1", 1, "7g.80gb"), gpu("n1", 2, "7g.80gb")],
        [relayout("n1", 0, (), "2 whole GPUs waiting"), relayout("n1", 1, (), "1 whole GPU waiting")],
        id="whole-gpus-wait-idle-mig-gpus-go-whole-as-many-as-wait",
    ),
    pytest.param(
        [wait(None, 1)],
        [gpu("n1", 0, *ONE_G, held=True), gpu("n1", 1)],
        [relayout("n1", 1, (), "1 whole GPU waiting")],
        id="whole-a-gpu-with-a-busy-slice-stays",
    ),
    pytest.param(
        [wait(None, 4)],
        [gpu("n1", 0, "7g.80gb"), gpu("n2", 0, "7g.80gb"), *(whole("n2", i) for i in (1, 2, 3))],
        [relayout("n2", 0, (), "4 whole GPUs waiting"), relayout("n1", 0, (), "3 whole GPUs waiting")],
        id="whole-first-where-whole-gpus-are-idle",
    ),
    pytest.param(
        [wait(None, 2)],
        [gpu("n1", 0, "7g.80gb", pending=()), gpu("n1", 1, "7g.80gb"), gpu("n1", 2, "7g.80gb")],
        [relayout("n1", 1, (), "1 whole GPU waiting")],
        id="whole-a-gpu-on-its-way-counts",
    ),
    pytest.param(
        [wait("H100", 1)],
        [gpu("a1", 0, "7g.80gb", model=A100), gpu("h1", 0, "7g.80gb")],
        [relayout("h1", 0, (), "1 whole GPU waiting")],
        id="whole-of-a-model-gets-that-model",
    ),
    pytest.param(
        [wait(None, 1, pool="a"), slices("1g.10gb", 1, pool="b")],
        [gpu("n1", 0, "7g.80gb", pool="a"), gpu("n2", 0, "7g.80gb", pool="b")],
        [relayout("n1", 0, (), "1 whole GPU waiting"), relayout("n2", 0, ONE_G, "1 1g.10gb slice waiting")],
        id="pools-apart",
    ),
]


@pytest.mark.parametrize(("waiting", "gpus", "want"), CASES)
def test_plan(waiting: list[Waiting], gpus: list[MigGpu], want: list[Relayout]) -> None:
    got = plan_layouts(waiting=waiting, gpus=gpus, now=NOW, max_changes=2, cooldown_s=600)
    assert got == want
    assert plan_layouts(waiting=waiting[::-1], gpus=gpus[::-1], now=NOW, max_changes=2, cooldown_s=600) == got
    for d in got:  # every layout is one the GPU can hold
        model = mig.model_for(next(g.model for g in gpus if (g.node, g.index) == (d.node, d.index)))
        assert model is not None and fits(model, d.layout)


UNTOUCHABLE = [
    pytest.param({"held": True}, id="a-job-holds-it"),
    pytest.param({"pending": ("3g.40gb",)}, id="a-layout-is-pending"),
    pytest.param({"cordoned": True}, id="cordoned-by-an-operator-or-health"),
    pytest.param({"ready": False}, id="its-node-is-not-ready"),
    pytest.param({"failed": True}, id="its-last-layout-failed"),
    pytest.param({"last_changed": NOW - 599}, id="laid-out-within-the-cooldown"),
    pytest.param({"mig_enabled": False}, id="mig-mode-off"),
]


@pytest.mark.parametrize("kw", UNTOUCHABLE)
@pytest.mark.parametrize("waiting", [slices("1g.10gb", 2), wait(None, 1)], ids=["slices", "whole"])
def test_never_touched(kw: dict[str, Any], waiting: Waiting) -> None:
    untouchable = gpu("n1", 0, "7g.80gb", **kw)
    assert plan_layouts(waiting=[waiting], gpus=[untouchable], now=NOW, cooldown_s=600) == []


def test_after_the_cooldown_a_gpu_may_change_again() -> None:
    g = gpu("n1", 0, "7g.80gb", last_changed=NOW - 600)
    got = plan_layouts(waiting=[slices("1g.10gb")], gpus=[g], now=NOW, cooldown_s=600)
    assert [d.layout for d in got] == [ONE_G]


def test_max_changes_spans_pools() -> None:
    gpus = [gpu(f"n{p}", 0, "7g.80gb", pool=p) for p in "abc"]
    waiting = [slices("1g.10gb", pool=p) for p in "abc"]
    got = plan_layouts(waiting=waiting, gpus=gpus, now=NOW, max_changes=2)
    assert [d.node for d in got] == ["na", "nb"]


@pytest.mark.parametrize(
    ("model", "wants", "want"),
    [
        (mig.H100_80GB, {"1g.10gb": 2}, ONE_G),
        (mig.H100_80GB, {"7g.80gb": 1}, ("7g.80gb",)),
        (mig.H100_80GB, {"3g.40gb": 3}, ("3g.40gb", "3g.40gb")),
        (mig.H100_80GB, {"4g.40gb": 1, "1g.10gb": 1}, ("4g.40gb", "1g.10gb", "1g.10gb", "1g.10gb")),
        (mig.H100_80GB, {"2g.20gb": 1, "1g.10gb": 4}, ("2g.20gb", *("1g.10gb",) * 5)),
        (mig.H100_80GB, {"2g.20gb": 5, "1g.10gb": 1}, ("2g.20gb",) * 3 + ("1g.10gb",)),
        (mig.A100_40GB, {"2g.10gb": 1, "1g.5gb": 5}, ("2g.10gb", *("1g.5gb",) * 5)),
        (mig.H100_80GB, {"1g.5gb": 3}, ()),
        (mig.H100_80GB, {"1g.10gb": 0}, ()),
    ],
    ids=[
        "one-profile-fills-the-gpu",
        "the-whole-slice",
        "no-more-than-the-profile-allows",
        "large-first-then-small-fill",
        "most-wanted-fills",
        "more-wanted-than-fit",
        "a100-40gb",
        "a-profile-the-model-lacks",
        "nothing-wanted",
    ],
)
def test_pack(model: mig.GpuModel, wants: dict[str, int], want: tuple[str, ...]) -> None:
    got = pack(model, wants)
    assert got == want
    assert not got or fits(model, got)


@pytest.mark.parametrize(
    ("gpu_type", "want"),
    [
        ("MIG 1g.10gb", "1g.10gb"),
        ("H100 MIG 3g.40gb", "3g.40gb"),
        ("mig 1G.10GB+ME", "1g.10gb+me"),
        ("MIG", None),
        ("H100", None),
        (None, None),
    ],
)
def test_profile_of(gpu_type: str | None, want: str | None) -> None:
    assert profile_of(gpu_type) == want
