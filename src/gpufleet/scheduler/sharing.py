"""Where a GPU share goes: placing asks for part of a GPU (or whole GPUs) on shared GPUs.

A shareable GPU is described by what is left of it, in thousandths (``1000``: untouched,
``0``: full); a node also has CPUs left and a GPU model. An ask is a fraction of one GPU
(``milli`` 1..999, as Alibaba's ``gpu_milli`` or a MIG slice's share), ``gpus`` whole
GPUs on one node, or CPUs only (``gpus=0``: a CPU task on a GPU node); each with ``cpus``
CPUs of that node and, optionally, the GPU ``models`` it may run on. Three ways to
choose, compared by ``bench/bench_sharing.py``:

- ``whole``: no sharing: a fractional ask takes a whole untouched GPU (and its CPUs);
- ``best-fit``: the tightest place that fits, the classic bin-packing heuristic
  (Kubernetes' ``MostAllocated``): the GPU with the least room for a fraction, the node
  with the fewest untouched GPUs for whole GPUs, and for CPUs only the node with the
  least GPU share free (so the CPUs it takes strand the fewest GPUs), then fewest CPUs;
  ties to the lowest node;
- ``fgd``: Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation:
  Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23):
  the place that least increases the *expected fragmentation* of its node for the mix
  of asks the cluster sees (``Mix``, weighted by popularity).

**Fragmentation** (``fragment``). For one kind of ask, a node's fragment is the part of
its free GPU share that asks of that kind could never take there: what would be left if
asks of that kind alone filled the node, as many copies as its GPUs *and CPUs* allow. A
fraction of ``m`` fits ``f // m`` times on a GPU with ``f`` left; ``g`` whole GPUs fit
once per ``g`` untouched GPUs; and at most ``cpus // ask.cpus`` copies fit in the node's
CPUs. The paper counts a GPU whose room is below the ask, and the whole node when the
ask does not fit once (wrong model, too few CPUs or untouched GPUs): those are the cases
of no copy, and this keeps them. It differs where one copy fits but CPUs or the GPU's
room stop the next: a node with 3 free GPUs and 12 CPUs strands 2 of them for one-GPU
asks with 11 CPUs (the paper: none), a GPU with 600 left strands 130 for 470-asks, and
for 2-GPU asks a third untouched GPU. With many CPUs and asks that divide a GPU the two
agree. CPU-only asks use no GPU share and add no fragment (the paper counts all free
share for them, the same for every choice, so no decision changes).

**Choice.** Over every way the ask fits (each node, and on it each distinct room of GPU
for a fraction; whole GPUs take the first untouched ones), ``fgd`` takes the least, in
order: (1) the popularity of the mix's kinds that this choice would leave with no place
to fit anywhere in the fleet (the fleet-level part of fragmentation that a sum over
nodes does not see: breaking the last empty node costs 8-GPU asks only their small
popularity times 8 GPUs there, yet the next one fails); (2) the increase of the node's
expected fragmentation; (3) best fit's order. Scores are exact integers, so equal moves
tie and best fit decides, not float noise. So ``fgd`` packs fractions onto GPUs already
shared before it touches an untouched one, keeps untouched GPUs together where whole-GPU
asks fit, and sends CPU-hungry asks away from nodes whose CPUs would strand their GPUs.

**Limits** (``bench/bench_sharing.py --explain`` shows them): weights are popularity, so
a rare kind bound to a small pool (asks for a few P100 nodes) weighs little, and ``fgd``
may fill that pool with other work where that lowers the popular kinds' fragmentation;
with departures and a queue without reservations, 8-GPU asks of a trace-like mix wait
longer for a node to drain than under best fit. Memory is not counted (Alibaba's openb
tasks ask 60 % of their nodes' memory and 80 % of their CPUs: CPUs bind first).

Pure: no clock, no I/O; the caller owns the state (``Shares``) and applies a choice with
``take``/``give``. A node's fragmentation depends only on its sorted free shares, CPUs
left and model, so ``Fragmentation`` memoises it; the caller owns one per fleet and mix.
A 400-GPU fleet places an ask in well under a millisecond.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

WHOLE = 1000
"""A whole GPU, in thousandths."""

Policy = Literal["whole", "best-fit", "fgd"]
POLICIES: tuple[Policy, ...] = ("whole", "best-fit", "fgd")

_SCALE = 1 << 20
"""Mix weights become integers summing to about this, so that scores are exact."""


@dataclass(frozen=True, slots=True)
class Ask:
    """``gpus`` whole GPUs on one node, ``milli`` thousandths of one GPU, or no GPU
    (``gpus=0``); ``cpus`` CPUs of that node with them (a node whose CPUs are gone
    strands its free GPUs); ``models``: the GPU models it may run on (empty: any)."""

    gpus: int = 1
    milli: int = WHOLE
    cpus: int = 0
    models: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not 1 <= self.milli <= WHOLE:
            raise ValueError(f"a GPU share is 1..1000 thousandths, got {self.milli}")
        if self.gpus < 0 or (self.milli < WHOLE and self.gpus != 1):
            raise ValueError(f"a fraction of a GPU is asked on one GPU, got {self.gpus} x {self.milli}")
        if self.cpus < 0:
            raise ValueError(f"CPUs asked must be >= 0, got {self.cpus}")

    @property
    def fractional(self) -> bool:
        return self.milli < WHOLE

    @property
    def cpu_only(self) -> bool:
        return self.gpus == 0

    @property
    def share(self) -> int:
        """Thousandths of a GPU in all."""
        return self.gpus * self.milli


Mix = tuple[tuple[Ask, float], ...]
"""The kinds of ask the cluster sees and their weights (popularity: they need not sum to 1)."""


def mix_of(asks: Iterable[Ask]) -> Mix:
    """The mix of a sample of asks (e.g. the waiting queue, or recent arrivals)."""
    count: dict[Ask, int] = {}
    for a in asks:
        count[a] = count.get(a, 0) + 1
    total = sum(count.values()) or 1
    order = sorted(count.items(), key=lambda x: (x[0].gpus, x[0].milli, x[0].cpus, sorted(x[0].models)))
    return tuple((a, n / total) for a, n in order)


@dataclass(slots=True)
class Shares:
    """The fleet's shareable GPUs: ``free[n][g]`` thousandths left on GPU ``g`` of node
    ``n``; ``cpus[n]`` CPUs left on node ``n`` (empty: CPUs not counted); ``models[n]``
    the GPU model of node ``n`` (empty: not known, and asks that name models fit nowhere)."""

    names: list[str]
    free: list[list[int]]
    cpus: list[int] = field(default_factory=list)
    models: list[str] = field(default_factory=list)

    @classmethod
    def empty(cls, nodes: int, gpus_per_node: int, cpus_per_node: int | None = None) -> Shares:
        names = [f"node-{i:03d}" for i in range(nodes)]
        cpus = [] if cpus_per_node is None else [cpus_per_node] * nodes
        return cls(names=names, free=[[WHOLE] * gpus_per_node for _ in range(nodes)], cpus=cpus)

    def cpus_left(self, node: int) -> int | None:
        return self.cpus[node] if self.cpus else None

    def model(self, node: int) -> str | None:
        return self.models[node] if self.models else None

    def unallocated(self) -> int:
        """Thousandths of GPU left in the whole fleet."""
        return sum(sum(f) for f in self.free)

    def capacity(self) -> int:
        return WHOLE * sum(len(f) for f in self.free)


@dataclass(frozen=True, slots=True)
class Choice:
    node: int
    gpus: tuple[int, ...]
    milli: int
    """Thousandths taken on each of ``gpus``."""
    cpus: int = 0


def take(shares: Shares, c: Choice) -> None:
    if shares.cpus:
        if shares.cpus[c.node] < c.cpus:
            raise ValueError(f"{shares.names[c.node]} has {shares.cpus[c.node]} CPUs left, not {c.cpus}")
        shares.cpus[c.node] -= c.cpus
    for g in c.gpus:
        left = shares.free[c.node][g] - c.milli
        if left < 0:
            raise ValueError(
                f"GPU {g} of {shares.names[c.node]} has {shares.free[c.node][g]} left, not {c.milli}"
            )
        shares.free[c.node][g] = left


def give(shares: Shares, c: Choice) -> None:
    if shares.cpus:
        shares.cpus[c.node] += c.cpus
    for g in c.gpus:
        back = shares.free[c.node][g] + c.milli
        if back > WHOLE:
            raise ValueError(f"GPU {g} of {shares.names[c.node]} would hold more than a whole GPU")
        shares.free[c.node][g] = back


def admits(cpus: int | None, model: str | None, ask: Ask) -> bool:
    """Whether a node with ``cpus`` CPUs left (None: not counted) and GPUs of ``model``
    could take ``ask``, GPU room aside."""
    if cpus is not None and cpus < ask.cpus:
        return False
    return ask.cpu_only or not ask.models or model in ask.models


def copies(free: Sequence[int], cpus: int | None, model: str | None, ask: Ask) -> int:
    """How many asks like ``ask`` the node could still take, by its GPUs and CPUs
    (CPU-only asks: by CPUs; unbounded ones count as 1)."""
    if not admits(cpus, model, ask):
        return 0
    by_cpus = cpus // ask.cpus if cpus is not None and ask.cpus else None
    if ask.cpu_only:
        return 1 if by_cpus is None else by_cpus
    if ask.fractional:
        by_gpus = sum(f // ask.milli for f in free)
    else:
        by_gpus = sum(1 for f in free if f == WHOLE) // ask.gpus
    return by_gpus if by_cpus is None else min(by_gpus, by_cpus)


def fragment(free: Sequence[int], cpus: int | None, model: str | None, ask: Ask) -> int:
    """Thousandths of the node's free GPU share that asks like ``ask`` could never take:
    what is left once as many of them as fit (by GPUs and CPUs) fill the node."""
    if ask.cpu_only:
        return 0
    return sum(free) - copies(free, cpus, model, ask) * ask.share


_Key = tuple[tuple[int, ...], int | None, str | None]


@dataclass(slots=True)
class Fragmentation:
    """A node's expected fragmentation for ``mix``: thousandths of GPU that the mix's asks,
    weighted by popularity, could not use there (``fragment``). Memoised on the node's
    sorted free shares, CPUs left and model; the caller owns it (one per fleet and mix)."""

    mix: Mix
    _kinds: tuple[tuple[Ask, int], ...] = field(init=False, repr=False)
    _total: float = field(init=False, repr=False)
    _memo: dict[_Key, tuple[int, int]] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._total = sum(p for _, p in self.mix)
        norm = self._total or 1.0
        self._kinds = tuple((a, round(p / norm * _SCALE)) for a, p in self.mix if p > 0)

    def __call__(self, free: Sequence[int], cpus: int | None = None, model: str | None = None) -> float:
        """In thousandths of GPU, weighted as ``mix`` is."""
        return self.score(free, cpus, model) * self._total / _SCALE

    def score(self, free: Sequence[int], cpus: int | None = None, model: str | None = None) -> int:
        """The same, exact: thousandths x ``2**20`` parts of the mix."""
        return self._node(free, cpus, model)[0]

    def fitting(self, free: Sequence[int], cpus: int | None = None, model: str | None = None) -> int:
        """The kinds of the mix that fit on the node now, as a bit set (bit ``i``: kind ``i``)."""
        return self._node(free, cpus, model)[1]

    def weight(self, kinds: int) -> int:
        """The popularity of a bit set of kinds, in ``2**20`` parts of the mix."""
        return sum(w for i, (_, w) in enumerate(self._kinds) if kinds >> i & 1)

    def _node(self, free: Sequence[int], cpus: int | None, model: str | None) -> tuple[int, int]:
        key = (tuple(sorted(free)), cpus, model)
        hit = self._memo.get(key)
        if hit is None:
            score = fits = 0
            for i, (a, w) in enumerate(self._kinds):
                n = copies(key[0], cpus, model, a)
                if not a.cpu_only:
                    score += w * (sum(key[0]) - n * a.share)
                if n:
                    fits |= 1 << i
            hit = self._memo[key] = (score, fits)
        return hit


def options(shares: Shares, ask: Ask) -> Iterator[tuple[Choice, list[int], list[int]]]:
    """Every distinct way ``ask`` fits now: (choice, the node's free shares before, after)."""
    for n, free in enumerate(shares.free):
        if not admits(shares.cpus_left(n), shares.model(n), ask):
            continue
        if ask.fractional:
            seen: set[int] = set()
            for g, f in enumerate(free):
                if f < ask.milli or f in seen:
                    continue
                seen.add(f)  # GPUs with the same room on a node are the same choice
                after = list(free)
                after[g] = f - ask.milli
                yield Choice(node=n, gpus=(g,), milli=ask.milli, cpus=ask.cpus), free, after
        else:
            untouched = [g for g, f in enumerate(free) if f == WHOLE][: ask.gpus]
            if len(untouched) < ask.gpus:
                continue
            after = list(free)
            for g in untouched:
                after[g] = 0
            milli = WHOLE if ask.gpus else 0  # a CPU-only ask takes no GPU share
            yield Choice(node=n, gpus=tuple(untouched), milli=milli, cpus=ask.cpus), free, after


def place(shares: Shares, ask: Ask, policy: Policy, frag: Fragmentation | None = None) -> Choice | None:
    """Where ``ask`` goes under ``policy`` (None: nowhere fits now). ``fgd`` needs ``frag``
    (the mix it keeps room for)."""
    if policy == "fgd" and frag is None:
        raise ValueError("fgd needs the mix's Fragmentation")
    if policy == "whole" and ask.fractional:
        ask = dataclasses.replace(ask, gpus=1, milli=WHOLE)
    sole = _sole_places(shares, frag) if policy == "fgd" and frag is not None else 0
    best: tuple[int, ...] | None = None
    choice: Choice | None = None
    for c, before, after in options(shares, ask):
        key = _best_fit(shares, ask, c, before)
        if policy == "fgd" and frag is not None:
            cpus = shares.cpus_left(c.node)
            left = None if cpus is None else cpus - ask.cpus
            model = shares.model(c.node)
            lost = sole & frag.fitting(before, cpus, model) & ~frag.fitting(after, left, model)
            rise = frag.score(after, left, model) - frag.score(before, cpus, model)
            key = (frag.weight(lost) if lost else 0, rise, *key)
        if best is None or key < best:
            best, choice = key, c
    return choice


def _sole_places(shares: Shares, frag: Fragmentation) -> int:
    """The kinds of the mix that fit on exactly one node now (bit set)."""
    once = twice = 0
    for n, free in enumerate(shares.free):
        fits = frag.fitting(free, shares.cpus_left(n), shares.model(n))
        twice |= once & fits
        once |= fits
    return once & ~twice


def _best_fit(shares: Shares, ask: Ask, c: Choice, before: Sequence[int]) -> tuple[int, ...]:
    """Best fit's order of a choice: least room first, then the lowest node and GPU."""
    room: tuple[int, ...]
    if ask.cpu_only:  # the node with the least GPU share free, then the fewest CPUs
        room = (sum(before), shares.cpus_left(c.node) or 0)
    elif ask.fractional:  # the GPU with the least room
        room = (before[c.gpus[0]],)
    else:  # the node with the fewest untouched GPUs
        room = (sum(1 for f in before if f == WHOLE),)
    return (*room, c.node, c.gpus[0] if c.gpus else 0)


__all__ = [
    "POLICIES",
    "WHOLE",
    "Ask",
    "Choice",
    "Fragmentation",
    "Mix",
    "Policy",
    "Shares",
    "admits",
    "copies",
    "fragment",
    "give",
    "mix_of",
    "options",
    "place",
    "take",
]
