"""Where a GPU share goes: placing asks for part of a GPU (or whole GPUs) on shared GPUs.

A shareable GPU is described by what is left of it, in thousandths (``1000``: untouched,
``0``: full). An ask is either a fraction of one GPU (``milli`` 1..999, as Alibaba's
``gpu_milli`` or a MIG slice's share) or ``gpus`` whole GPUs on one node. Three ways to
choose, compared by ``bench/bench_sharing.py``:

- ``whole``: no sharing: a fractional ask takes a whole untouched GPU;
- ``best-fit``: the GPU (or node, for whole GPUs) with the least room that still fits,
  the classic bin-packing heuristic (Kubernetes' ``MostAllocated`` scoring);
- ``fgd``: Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation:
  Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC'23):
  the placement that least increases the node's *expected fragmentation* for the mix of
  asks the cluster sees (``Mix``). A node's fragmentation for one kind of ask is the GPU
  share it holds that this ask could not use: the leftovers smaller than a fractional
  ask, or, for ``k`` whole GPUs, all its free share when fewer than ``k`` GPUs are
  untouched (else its partly used GPUs' leftovers). Ties go to best fit. It packs
  fractional work onto GPUs already shared before touching an untouched one, and keeps
  untouched GPUs together on nodes where whole-GPU asks still fit.

Pure: no clock, no I/O; the caller owns the state (``Shares``) and applies a choice
with ``take``/``give``. A node's fragmentation depends only on its multiset of free
shares, so it is memoised per sorted tuple (``Fragmentation``): a 400-GPU fleet places an
ask in well under a millisecond.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

WHOLE = 1000
"""A whole GPU, in thousandths."""

Policy = Literal["whole", "best-fit", "fgd"]
POLICIES: tuple[Policy, ...] = ("whole", "best-fit", "fgd")


@dataclass(frozen=True, slots=True)
class Ask:
    """``gpus`` whole GPUs on one node, or ``milli`` thousandths of one GPU; and ``cpus``
    CPUs of that node with them (a node whose CPUs are gone strands its free GPUs)."""

    gpus: int = 1
    milli: int = WHOLE
    cpus: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.milli <= WHOLE:
            raise ValueError(f"a GPU share is 1..1000 thousandths, got {self.milli}")
        if self.gpus < 1 or (self.milli < WHOLE and self.gpus != 1):
            raise ValueError(f"a fraction of a GPU is asked on one GPU, got {self.gpus} x {self.milli}")
        if self.cpus < 0:
            raise ValueError(f"CPUs asked must be >= 0, got {self.cpus}")

    @property
    def fractional(self) -> bool:
        return self.milli < WHOLE

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
    order = sorted(count.items(), key=lambda x: (x[0].gpus, x[0].milli, x[0].cpus))
    return tuple((a, n / total) for a, n in order)


@dataclass(slots=True)
class Shares:
    """The fleet's shareable GPUs: ``free[n][g]`` thousandths left on GPU ``g`` of node
    ``n``, and ``cpus[n]`` CPUs left on node ``n`` (empty: CPUs not counted)."""

    names: list[str]
    free: list[list[int]]
    cpus: list[int] = field(default_factory=list)

    @classmethod
    def empty(cls, nodes: int, gpus_per_node: int, cpus_per_node: int | None = None) -> Shares:
        names = [f"node-{i:03d}" for i in range(nodes)]
        cpus = [] if cpus_per_node is None else [cpus_per_node] * nodes
        return cls(names=names, free=[[WHOLE] * gpus_per_node for _ in range(nodes)], cpus=cpus)

    def cpus_left(self, node: int) -> int | None:
        return self.cpus[node] if self.cpus else None

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


@dataclass(slots=True)
class Fragmentation:
    """A node's expected fragmentation for ``mix`` (thousandths of GPU that the mix's asks,
    weighted, could not use), memoised on the node's sorted free shares."""

    mix: Mix
    _memo: dict[tuple[tuple[int, ...], int | None], float] = field(default_factory=dict)

    def __call__(self, free: Sequence[int], cpus: int | None = None) -> float:
        key = (tuple(sorted(free)), cpus)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = sum(p * _frag(key[0], cpus, a) for a, p in self.mix)
        return hit


def _frag(free: tuple[int, ...], cpus: int | None, a: Ask) -> int:
    if cpus is not None and cpus < a.cpus:
        return sum(free)  # no CPUs for it here: every free share of the node is stranded for it
    if a.fractional:
        return sum(f for f in free if f < a.milli)
    untouched = sum(1 for f in free if f == WHOLE)
    if untouched < a.gpus:
        return sum(free)
    return sum(f for f in free if f < WHOLE)


def place(shares: Shares, ask: Ask, policy: Policy, frag: Fragmentation | None = None) -> Choice | None:
    """Where ``ask`` goes under ``policy`` (None: nowhere fits now). ``fgd`` needs ``frag``
    (the mix it keeps room for)."""
    if policy == "whole" and ask.fractional:
        ask = Ask(gpus=1, milli=WHOLE)
    if ask.fractional:
        return _fraction(shares, ask, policy, frag)
    return _whole(shares, ask, policy, frag)


def _fraction(shares: Shares, ask: Ask, policy: Policy, frag: Fragmentation | None) -> Choice | None:
    best: tuple[float, int, int, int] | None = None  # (score, room, node, gpu)
    for n, free in enumerate(shares.free):
        cpus = shares.cpus_left(n)
        if cpus is not None and cpus < ask.cpus:
            continue
        seen: set[int] = set()
        for g, f in enumerate(free):
            if f < ask.milli or f in seen:
                continue
            seen.add(f)  # GPUs with the same room on a node are the same choice
            if policy == "fgd":
                if frag is None:
                    raise ValueError("fgd needs the mix's Fragmentation")
                after = list(free)
                after[g] = f - ask.milli
                score = frag(after, _less(cpus, ask)) - frag(free, cpus)
            else:
                score = 0.0
            key = (score, f, n, g)
            if best is None or key < best:
                best = key
    return None if best is None else Choice(node=best[2], gpus=(best[3],), milli=ask.milli, cpus=ask.cpus)


def _less(cpus: int | None, ask: Ask) -> int | None:
    return None if cpus is None else cpus - ask.cpus


def _whole(shares: Shares, ask: Ask, policy: Policy, frag: Fragmentation | None) -> Choice | None:
    best: tuple[float, int, int] | None = None  # (score, untouched GPUs, node)
    for n, free in enumerate(shares.free):
        cpus = shares.cpus_left(n)
        if cpus is not None and cpus < ask.cpus:
            continue
        untouched = [g for g, f in enumerate(free) if f == WHOLE]
        if len(untouched) < ask.gpus:
            continue
        if policy == "fgd":
            if frag is None:
                raise ValueError("fgd needs the mix's Fragmentation")
            after = list(free)
            for g in untouched[: ask.gpus]:
                after[g] = 0
            score = frag(after, _less(cpus, ask)) - frag(free, cpus)
        else:
            score = 0.0
        key = (score, len(untouched), n)
        if best is None or key < best:
            best = key
    if best is None:
        return None
    n = best[2]
    gpus = tuple(g for g, f in enumerate(shares.free[n]) if f == WHOLE)[: ask.gpus]
    return Choice(node=n, gpus=gpus, milli=WHOLE, cpus=ask.cpus)


__all__ = [
    "POLICIES",
    "WHOLE",
    "Ask",
    "Choice",
    "Fragmentation",
    "Mix",
    "Policy",
    "Shares",
    "give",
    "mix_of",
    "place",
    "take",
]
