"""Placing GPU shares (``scheduler/sharing.py``): table tests of the three policies and
of the fragmentation measure FGD minimises."""

from __future__ import annotations

import pytest

from gpufleet.scheduler.sharing import WHOLE, Ask, Choice, Fragmentation, Shares, give, mix_of, place, take


def _shares(*nodes: list[int]) -> Shares:
    return Shares(names=[f"n{i}" for i in range(len(nodes))], free=[list(n) for n in nodes])


@pytest.mark.parametrize(
    ("gpus", "milli", "ok"),
    [
        (1, 1000, True),
        (8, 1000, True),
        (1, 1, True),
        (1, 999, True),
        (2, 500, False),
        (0, 1000, False),
        (1, 0, False),
        (1, 1001, False),
    ],
)
def test_asks(gpus: int, milli: int, ok: bool) -> None:
    if ok:
        assert Ask(gpus=gpus, milli=milli).share == gpus * milli
    else:
        with pytest.raises(ValueError):
            Ask(gpus=gpus, milli=milli)


@pytest.mark.parametrize(
    ("free", "ask", "frag"),
    [
        ((1000, 1000), Ask(milli=500), 0),
        ((300, 1000), Ask(milli=500), 300),  # 300 left on a GPU: a half cannot use it
        ((300, 600), Ask(milli=500), 300),
        ((0, 0), Ask(milli=500), 0),
        ((1000, 1000), Ask(gpus=2), 0),
        ((1000, 400), Ask(gpus=2), 1400),  # one untouched GPU: all of it is stranded for a pair
        ((1000, 1000, 400), Ask(gpus=2), 400),  # the pair fits; the partial GPU is stranded
        ((1000, 1000, 400), Ask(gpus=1), 400),
    ],
)
def test_fragmentation_of_a_node_for_one_kind_of_ask(free: tuple[int, ...], ask: Ask, frag: int) -> None:
    assert Fragmentation(mix=((ask, 1.0),))(free) == frag


def test_fragmentation_weighs_the_mix() -> None:
    mix = ((Ask(milli=500), 0.5), (Ask(gpus=2), 0.5))
    assert Fragmentation(mix=mix)((1000, 300)) == pytest.approx(0.5 * 300 + 0.5 * 1300)
    assert mix_of([Ask(milli=500), Ask(milli=500), Ask(gpus=2), Ask(milli=500)]) == (
        (Ask(milli=500), 0.75),
        (Ask(gpus=2), 0.25),
    )


def test_best_fit_takes_the_tightest_gpu_that_fits() -> None:
    s = _shares([1000, 600], [400, 300])
    assert place(s, Ask(milli=300), "best-fit") == Choice(node=1, gpus=(1,), milli=300)
    assert place(s, Ask(milli=500), "best-fit") == Choice(node=0, gpus=(1,), milli=500)
    assert place(s, Ask(milli=700), "best-fit") == Choice(node=0, gpus=(0,), milli=700)
    assert place(s, Ask(milli=1000), "best-fit") == Choice(node=0, gpus=(0,), milli=1000)


def test_whole_policy_gives_a_fraction_a_whole_untouched_gpu() -> None:
    s = _shares([500, 1000])
    assert place(s, Ask(milli=100), "whole") == Choice(node=0, gpus=(1,), milli=WHOLE)
    assert place(_shares([500, 500]), Ask(milli=100), "whole") is None


def test_fgd_keeps_a_node_whole_where_best_fit_breaks_it() -> None:
    """Node 0 is untouched (an 8-GPU ask still fits there); node 1 has one untouched GPU.
    A half-GPU ask: best fit takes the first of the equally roomy GPUs (node 0); FGD
    sees that breaking node 0 strands its 8-GPU room and takes node 1's GPU."""
    s = _shares([1000] * 8, [1000] + [0] * 7)
    frag = Fragmentation(mix=mix_of([Ask(gpus=8), Ask(milli=500), Ask(milli=500)]))
    assert place(s, Ask(milli=500), "best-fit") == Choice(node=0, gpus=(0,), milli=500)
    assert place(s, Ask(milli=500), "fgd", frag) == Choice(node=1, gpus=(0,), milli=500)


def test_fgd_packs_onto_a_shared_gpu_before_an_untouched_one() -> None:
    s = _shares([1000, 500, 1000])
    frag = Fragmentation(mix=mix_of([Ask(milli=250), Ask(gpus=1)]))
    assert place(s, Ask(milli=250), "fgd", frag) == Choice(node=0, gpus=(1,), milli=250)


def test_whole_gpus_on_one_node_and_none_when_nothing_fits() -> None:
    s = _shares([1000, 1000, 500], [1000, 1000, 1000])
    assert place(s, Ask(gpus=2), "best-fit") == Choice(node=0, gpus=(0, 1), milli=WHOLE)
    assert place(s, Ask(gpus=3), "best-fit") == Choice(node=1, gpus=(0, 1, 2), milli=WHOLE)
    assert place(s, Ask(gpus=4), "best-fit") is None
    assert place(_shares([100, 200]), Ask(milli=300), "fgd", Fragmentation(mix=())) is None


def test_take_and_give_keep_a_gpu_between_empty_and_whole() -> None:
    s = _shares([1000, 300])
    take(s, Choice(node=0, gpus=(1,), milli=300))
    assert s.free == [[1000, 0]] and s.unallocated() == 1000 and s.capacity() == 2000
    with pytest.raises(ValueError, match="has 0 left"):
        take(s, Choice(node=0, gpus=(1,), milli=1))
    give(s, Choice(node=0, gpus=(1,), milli=300))
    with pytest.raises(ValueError, match="more than a whole GPU"):
        give(s, Choice(node=0, gpus=(0,), milli=1))
    with pytest.raises(ValueError, match="fgd needs"):
        place(s, Ask(milli=100), "fgd")
