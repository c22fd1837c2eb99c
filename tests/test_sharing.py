"""Placing GPU shares (``scheduler/sharing.py``): table tests of the three policies and
of the fragmentation measure FGD minimises."""

from __future__ import annotations

import pytest

from gpufleet.scheduler.sharing import (
    WHOLE,
    Ask,
    Choice,
    Fragmentation,
    Mix,
    Shares,
    copies,
    fragment,
    give,
    mix_of,
    place,
    take,
)


def _shares(*nodes: list[int], cpus: list[int] | None = None, models: list[str] | None = None) -> Shares:
    return Shares(
        names=[f"n{i}" for i in range(len(nodes))],
        free=[list(n) for n in nodes],
        cpus=cpus or [],
        models=models or [],
    )


def _t4(gpus: int = 1, milli: int = WHOLE, cpus: int = 0) -> Ask:
    return Ask(gpus=gpus, milli=milli, cpus=cpus, models=frozenset({"T4"}))


@pytest.mark.parametrize(
    ("gpus", "milli", "share"),
    [
        (1, 1000, 1000),
        (8, 1000, 8000),
        (1, 1, 1),
        (1, 999, 999),
        (0, 1000, 0),  # CPUs only
        (2, 500, None),
        (0, 500, None),
        (-1, 1000, None),
        (1, 0, None),
        (1, 1001, None),
    ],
)
def test_asks(gpus: int, milli: int, share: int | None) -> None:
    if share is not None:
        assert Ask(gpus=gpus, milli=milli).share == share
    else:
        with pytest.raises(ValueError):
            Ask(gpus=gpus, milli=milli)


@pytest.mark.parametrize(
    ("free", "cpus", "model", "ask", "frag"),
    [
        ((1000, 1000), None, None, Ask(milli=500), 0),
        ((300, 1000), None, None, Ask(milli=500), 300),  # 300 left on a GPU: a half cannot use it
        ((300, 600), None, None, Ask(milli=500), 400),  # and 600 holds one half, 100 stays
        ((0, 0), None, None, Ask(milli=500), 0),
        ((1000, 1000), None, None, Ask(gpus=2), 0),
        ((1000, 400), None, None, Ask(gpus=2), 1400),  # one untouched GPU: all of it is stranded for a pair
        ((1000, 1000, 400), None, None, Ask(gpus=2), 400),  # the pair fits; the partial GPU is stranded
        ((1000, 1000, 1000), None, None, Ask(gpus=2), 1000),  # and so is a third untouched GPU
        ((1000, 1000, 400), None, None, Ask(gpus=1), 400),
        ((1000, 1000, 1000), 12, None, Ask(gpus=1, cpus=11), 2000),  # CPUs for one: two GPUs stranded
        ((1000, 1000, 1000), 8, None, Ask(gpus=1, cpus=11), 3000),  # CPUs for none: all stranded
        ((1000, 1000, 1000), 96, None, Ask(gpus=1, cpus=11), 0),
        ((1000, 500), 12, None, Ask(milli=250, cpus=4), 750),  # three quarters fit the CPUs
        ((1000, 500), None, "G2", _t4(), 1500),  # the wrong model: all stranded
        ((1000, 500), None, "T4", _t4(), 500),
        ((1000, 500), 0, None, Ask(gpus=0, cpus=8), 0),  # CPU-only asks use no GPU share
    ],
)
def test_fragmentation_of_a_node_for_one_kind_of_ask(
    free: tuple[int, ...], cpus: int | None, model: str | None, ask: Ask, frag: int
) -> None:
    assert fragment(free, cpus, model, ask) == frag
    assert Fragmentation(mix=((ask, 1.0),))(free, cpus, model) == frag


def test_fragmentation_weighs_the_mix() -> None:
    mix = ((Ask(milli=500), 0.5), (Ask(gpus=2), 0.5))
    assert Fragmentation(mix=mix)((1000, 300)) == pytest.approx(0.5 * 300 + 0.5 * 1300)
    assert mix_of([Ask(milli=500), Ask(milli=500), Ask(gpus=2), Ask(milli=500)]) == (
        (Ask(milli=500), 0.75),
        (Ask(gpus=2), 0.25),
    )
    assert copies((1000, 600), 20, None, Ask(milli=300, cpus=4)) == 5  # GPUs room for 5, CPUs for 5
    assert copies((1000, 600), 12, None, Ask(milli=300, cpus=4)) == 3


def test_best_fit_takes_the_tightest_gpu_that_fits() -> None:
    s = _shares([1000, 600], [400, 300])
    assert place(s, Ask(milli=300), "best-fit") == Choice(node=1, gpus=(1,), milli=300)
    assert place(s, Ask(milli=500), "best-fit") == Choice(node=0, gpus=(1,), milli=500)
    assert place(s, Ask(milli=700), "best-fit") == Choice(node=0, gpus=(0,), milli=700)
    assert place(s, Ask(milli=1000), "best-fit") == Choice(node=0, gpus=(0,), milli=1000)


def test_whole_policy_gives_a_fraction_a_whole_untouched_gpu_and_its_cpus() -> None:
    s = _shares([500, 1000], cpus=[8])
    assert place(s, Ask(milli=100, cpus=4), "whole") == Choice(node=0, gpus=(1,), milli=WHOLE, cpus=4)
    assert place(s, Ask(milli=100, cpus=9), "whole") is None
    assert place(_shares([500, 500]), Ask(milli=100), "whole") is None


_PACK: Mix = ((Ask(milli=250), 0.5), (Ask(gpus=1), 0.5))
_GANG: Mix = ((Ask(gpus=8), 1 / 3), (Ask(milli=500), 2 / 3))
_PAIRS: Mix = ((Ask(gpus=2), 0.5), (Ask(gpus=1), 0.5))
_CPUS: Mix = ((Ask(gpus=1, cpus=11), 0.5), (Ask(milli=500, cpus=3), 0.5))
_BIG_CPU: Mix = ((Ask(gpus=0, cpus=32), 0.5), (Ask(milli=500), 0.5))
_MODELS: Mix = ((Ask(gpus=1), 0.5), (_t4(), 0.5))


@pytest.mark.parametrize(
    ("shares", "mix", "ask", "best_fit", "fgd"),
    [
        pytest.param(
            _shares([1000, 500, 1000]),
            _PACK,
            Ask(milli=250),
            Choice(node=0, gpus=(1,), milli=250),
            Choice(node=0, gpus=(1,), milli=250),
            id="a fraction goes onto a shared GPU before an untouched one",
        ),
        pytest.param(
            # best fit takes the first of the equally roomy GPUs, on the only node where an
            # 8-GPU ask fits; fgd takes the untouched GPU of the busy node
            _shares([1000] * 8, [1000] + [0] * 7),
            _GANG,
            Ask(milli=500),
            Choice(node=0, gpus=(0,), milli=500),
            Choice(node=1, gpus=(0,), milli=500),
            id="a fraction keeps off the last node with 8 untouched GPUs",
        ),
        pytest.param(
            # best fit breaks the node with fewer untouched GPUs and leaves 1 + 3: one pair
            # fits; fgd leaves 2 + 2: two pairs fit
            _shares([1000] * 3, [1000] * 2),
            _PAIRS,
            Ask(gpus=1),
            Choice(node=1, gpus=(0,), milli=WHOLE),
            Choice(node=0, gpus=(0,), milli=WHOLE),
            id="a whole GPU keeps untouched GPUs in pairs",
        ),
        pytest.param(
            # node 0 has CPUs for one more 11-CPU GPU: best fit puts it there and strands the
            # other GPU (1 CPU left); fgd puts it on the node with CPUs to spare and keeps
            # node 0's 12 CPUs for four 3-CPU halves
            _shares([1000, 1000], [1000] * 4, cpus=[12, 96]),
            _CPUS,
            Ask(gpus=1, cpus=11),
            Choice(node=0, gpus=(0,), milli=WHOLE, cpus=11),
            Choice(node=1, gpus=(0,), milli=WHOLE, cpus=11),
            id="a CPU-hungry ask keeps off a node whose CPUs would strand its GPUs",
        ),
        pytest.param(
            # both nodes' GPUs are full or unaffected, so no fragmentation changes; best fit
            # takes the node with no free GPU, which is the last with 32 CPUs
            _shares([0], [1000], cpus=[32, 8]),
            _BIG_CPU,
            Ask(gpus=0, cpus=8),
            Choice(node=0, gpus=(), milli=0, cpus=8),
            Choice(node=1, gpus=(), milli=0, cpus=8),
            id="a CPU-only ask keeps off the last node where a kind of the mix fits",
        ),
        pytest.param(
            _shares([1000], [1000], models=["T4", "G2"]),
            _MODELS,
            Ask(gpus=1),
            Choice(node=0, gpus=(0,), milli=WHOLE),
            Choice(node=1, gpus=(0,), milli=WHOLE),
            id="an ask for any GPU keeps off the GPUs that model-bound asks need",
        ),
        pytest.param(
            _shares([1000], [1000], models=["T4", "G2"]),
            _MODELS,
            _t4(),
            Choice(node=0, gpus=(0,), milli=WHOLE),
            Choice(node=0, gpus=(0,), milli=WHOLE),
            id="a model-bound ask goes where its model is",
        ),
    ],
)
def test_placement_decisions(shares: Shares, mix: Mix, ask: Ask, best_fit: Choice, fgd: Choice) -> None:
    assert place(shares, ask, "best-fit") == best_fit
    assert place(shares, ask, "fgd", Fragmentation(mix=mix)) == fgd


def test_whole_gpus_on_one_node_and_none_when_nothing_fits() -> None:
    s = _shares([1000, 1000, 500], [1000, 1000, 1000])
    assert place(s, Ask(gpus=2), "best-fit") == Choice(node=0, gpus=(0, 1), milli=WHOLE)
    assert place(s, Ask(gpus=3), "best-fit") == Choice(node=1, gpus=(0, 1, 2), milli=WHOLE)
    assert place(s, Ask(gpus=4), "best-fit") is None
    assert place(_shares([100, 200]), Ask(milli=300), "fgd", Fragmentation(mix=())) is None
    assert place(_shares([1000], models=["G2"]), _t4(), "fgd", Fragmentation(mix=())) is None
    assert place(_shares([1000]), _t4(), "best-fit") is None  # a fleet of unknown models


def test_take_and_give_keep_a_gpu_between_empty_and_whole() -> None:
    s = _shares([1000, 300], cpus=[4])
    take(s, Choice(node=0, gpus=(1,), milli=300, cpus=4))
    assert s.free == [[1000, 0]] and s.cpus == [0] and s.unallocated() == 1000 and s.capacity() == 2000
    with pytest.raises(ValueError, match="has 0 left"):
        take(s, Choice(node=0, gpus=(1,), milli=1))
    with pytest.raises(ValueError, match="0 CPUs left"):
        take(s, Choice(node=0, gpus=(), milli=0, cpus=1))
    give(s, Choice(node=0, gpus=(1,), milli=300, cpus=4))
    assert s.cpus == [4]
    with pytest.raises(ValueError, match="more than a whole GPU"):
        give(s, Choice(node=0, gpus=(0,), milli=1))
    with pytest.raises(ValueError, match="fgd needs"):
        place(s, Ask(milli=100), "fgd")
