"""``release_plan`` and ``Capacity.requeue`` against the one-by-one procedure they
replace: release victims until the shape fits, take back the unneeded ones best-ranked
first, retake everything on failure. Decisions and free-count bucket order (what best
fit sees first) must come out the same."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from factories import running, uniform_fleet
from gpufleet.scheduler.capacity import Capacity, FleetIndex, GroupKey
from gpufleet.scheduler.release import (
    Completions,
    Eligible,
    Gains,
    GroupVictims,
    Release,
    release_by_nodes,
    release_plan,
)

GK: GroupKey = ("default", "H100")


def capacity(free: list[int]) -> Capacity:
    """A group of ``len(free)`` 8-GPU nodes with these free counts (nodes named n0...)."""
    cap = Capacity.build(FleetIndex(uniform_fleet(len(free))), ())
    for nid, f in enumerate(free):
        cap.set_free(nid, f)
    return cap


def victims(gains: list[Gains]) -> GroupVictims:
    """Victims worst-ranked first: the first gets the largest key."""
    n = len(gains)
    return GroupVictims(((n - j,), running(f"v{j}", {"n0": (0,)}), g) for j, g in enumerate(gains))


def buckets(cap: Capacity) -> list[list[int]]:
    return [list(b) for b in cap.groups[GK].by_free]


def one_by_one(
    cap: Capacity, shape: tuple[int, ...], gains: list[Gains], eligible: list[int]
) -> list[int] | None:
    """The reference: what ``preempt._preempt_one_by_one`` does on the capacity itself."""
    group = cap.groups[GK]

    def shift(j: int, sign: int) -> None:
        for nid, c in gains[j]:
            cap.set_free(nid, cap.free[nid] + sign * c)

    released: list[int] = []
    for j in eligible:
        shift(j, 1)
        released.append(j)
        if group.fits(shape):
            break
    if not group.fits(shape):
        for j in released:
            shift(j, -1)
        return None
    spared: set[int] = set()
    for i in range(len(released) - 2, -1, -1):
        shift(released[i], -1)
        if group.fits(shape):
            spared.add(i)
        else:
            shift(released[i], 1)
    return [j for i, j in enumerate(released) if i not in spared]


def fast(cap: Capacity, shape: tuple[int, ...], gains: list[Gains], eligible: list[int]) -> Release:
    got = release_plan(cap.free, cap.groups[GK].count_ge, shape, victims(gains), iter(eligible))
    cap.requeue(GK, got.moved, got.free)
    return got


CASES = [
    pytest.param(
        [0, 0], (8,), [((0, 4),), ((1, 8),), ((0, 4),)], [0, 1, 2], [1], id="first-node-to-fill-wins"
    ),
    pytest.param(
        [0, 4],
        (8,),
        [((1, 2),), ((0, 4),), ((1, 2),)],
        [0, 1, 2],
        [0, 2],
        id="spares-an-unneeded-victim-between",
    ),
    pytest.param([0, 0], (8,), [((0, 4),), ((1, 4),)], [0, 1], None, id="no-fit-gives-everything-back"),
    pytest.param([0, 0], (8,), [((0, 4),), ((0, 4),)], [1], None, id="only-eligible-victims-count"),
    pytest.param(
        [0, 0, 0], (8, 8), [((0, 8), (1, 8)), ((2, 8),)], [0, 1], [0], id="one-gang-frees-two-nodes"
    ),
    pytest.param(
        [2, 0, 6], (8, 4), [((1, 4),), ((0, 2),), ((2, 2),)], [0, 1, 2], [0, 2], id="two-thresholds"
    ),
    pytest.param([8, 0], (8,), [((1, 0),), ((1, 8),)], [0, 1], [0], id="fits-already-still-evicts-the-first"),
    pytest.param([8, 0], (8,), [], [], [], id="fits-already-without-victims"),
    pytest.param(
        [0, 0], (1,), [((0, 0),), ((1, 1),)], [0, 1], [1], id="victim-without-countable-gpus-is-spared"
    ),
]


@pytest.mark.parametrize(("free", "shape", "gains", "eligible", "want"), CASES)
def test_release_plan(
    free: list[int], shape: tuple[int, ...], gains: list[Gains], eligible: list[int], want: list[int] | None
) -> None:
    ref, new = capacity(free), capacity(free)
    expected = one_by_one(ref, shape, gains, eligible)
    got = fast(new, shape, gains, eligible)
    assert expected == want
    assert (got.evict if got.fits else None) == want
    assert new.free == ref.free
    assert buckets(new) == buckets(ref)


def random_case(rng: random.Random) -> tuple[list[int], tuple[int, ...], list[Gains], list[int]]:
    nodes = rng.randint(1, 24)
    free = [rng.choice([0, 0, 0, 1, 2, 4, 6, 8]) for _ in range(nodes)]
    held = [8 - f for f in free]
    gains: list[Gains] = []
    for _ in range(rng.randint(0, 40)):
        parts = []
        for nid in rng.sample(range(nodes), min(nodes, rng.choice([1, 1, 1, 2, 3]))):
            c = rng.randint(0, held[nid])
            held[nid] -= c
            parts.append((nid, c))
        gains.append(tuple(parts))
    eligible = [j for j in range(len(gains)) if rng.random() < 0.85]
    width = rng.choice([1, 2, 4, 8, 8, 12, 16, 24, 32])
    per = rng.choice([8, 8, 4, 2])
    shape = (width,) if width <= per else (per,) * (width // per) + ((width % per,) if width % per else ())
    return free, shape, gains, eligible


@pytest.mark.parametrize("seed", range(40), ids=lambda s: f"seed-{s}")
def test_release_plan_matches_one_by_one(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(50):
        free, shape, gains, eligible = random_case(rng)
        ref, new = capacity(free), capacity(free)
        expected = one_by_one(ref, shape, gains, eligible)
        got = fast(new, shape, gains, eligible)
        assert (got.evict if got.fits else None) == expected
        assert new.free == ref.free
        assert buckets(new) == buckets(ref)
        assert new.groups[GK].count_ge == ref.groups[GK].count_ge
        assert new.groups[GK].total == ref.groups[GK].total


@pytest.mark.parametrize("count", [0, 1, 5, 16, 17, 40], ids=lambda n: f"{n}-nodes")
def test_requeue_matches_set_free_in_turn(count: int) -> None:
    rng = random.Random(count)
    free = [rng.randint(0, 8) for _ in range(48)]
    nodes = rng.sample(range(48), count)
    new = {nid: rng.randint(0, 8) for nid in nodes if rng.random() < 0.3}
    ref, got = capacity(free), capacity(free)
    for nid in nodes:  # out and back in (``move`` re-appends even when unchanged)
        f = ref.free[nid]
        ref.set_free(nid, 8 if f == 0 else 0)
        ref.set_free(nid, new.get(nid, f))
    got.requeue(GK, nodes, new)
    assert got.free == ref.free
    assert buckets(got) == buckets(ref)
    assert got.groups[GK].count_ge == ref.groups[GK].count_ge
    assert got.groups[GK].total == ref.groups[GK].total


def outside(banned: frozenset[int]) -> Callable[[int], bool]:
    return lambda j: j not in banned


def occupied_buckets(cap: Capacity) -> tuple[list[list[int]], set[int]]:
    """Buckets with free GPUs in order; the order of the no-free bucket is never read."""
    by_free = cap.groups[GK].by_free
    return [list(b) for b in by_free[1:]], set(by_free[0])


@pytest.mark.parametrize("seed", range(60), ids=lambda s: f"seed-{s}")
def test_node_path_matches_one_by_one_pass_after_pass(seed: int) -> None:
    """A pass in miniature: jobs of k x t GPUs preempt one after another while others
    start; ``Completions`` follows the changes through its log, as the preemption step does."""
    rng = random.Random(seed)
    free, _, gains, _ = random_case(rng)
    gv = victims(gains)
    ref, new = capacity(free), capacity(free)
    preempted: set[str] = set()
    changed: list[int] = []
    heaps: dict[int, Completions] = {}
    for step in range(40):
        t, k = rng.choice([1, 2, 4, 8, 8]), rng.choice([1, 1, 2, 3])
        shape = (t,) * k
        end = rng.randint(0, len(gains))
        banned = frozenset(j for j in range(end) if rng.random() < 0.1)
        eligible = [j for j in range(end) if gv.ids[j] not in preempted and j not in banned]
        group = new.groups[GK]
        if group.count_ge[t] >= k:
            continue  # fits already: the pass would have placed it without preempting
        expected = one_by_one(ref, shape, gains, eligible)
        who = Eligible(gv, end, preempted, outside(banned))
        comp = heaps.get(t)
        if comp is None:
            comp = heaps[t] = Completions(gv, t, range(len(free)), new.free, preempted, changed)
        else:
            comp.refresh(changed, new.free, preempted)
        found = comp.first(k - group.count_ge[t], new.free, who)
        if found is None:
            got = release_plan(new.free, group.count_ge, shape, gv, iter(eligible))
        else:
            occupied = [nid for b in group.by_free[1:] for nid in b]
            got = release_by_nodes(new.free, group.count_ge[t], shape, found, who, occupied)
        new.requeue(GK, got.moved, got.free)
        assert (got.evict if got.fits else None) == expected, f"step {step}"
        assert new.free == ref.free
        assert occupied_buckets(new) == occupied_buckets(ref)
        for j in expected or ():
            preempted.add(gv.ids[j])
            changed.extend(nid for nid, _ in gains[j])
        nid = rng.randrange(len(free))  # another job starts somewhere
        took = min(new.free[nid], rng.randint(0, 3))
        for cap in (ref, new):
            cap.set_free(nid, cap.free[nid] - took)
        changed.append(nid)
