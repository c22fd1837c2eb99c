"""Which running jobs to preempt so that a shape fits, worked out on free counts.

``GroupVictims`` and ``release_plan`` answer "which victims, fewest and worst-ranked
first, make this shape fit in this group" with arithmetic on free counts, for the pass
(preempt.py) to apply in one go (see ``release_plan`` for the rule). For wide jobs that must free
whole nodes, ``Completions`` and ``release_by_nodes`` find the same answer from the few
nodes that fill up first, instead of a scan over the ~thousand victims before them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import NamedTuple

from gpufleet.scheduler.model import RunningJob
from gpufleet.scheduler.policies.base import Key

Gains = tuple[tuple[int, int], ...]  # (node id, GPUs that preempting a job frees there), placement order


class GroupVictims:
    """The pass's victims that hold GPUs in one group, worst-ranked first, as parallel
    lists: built once per pass and group, scanned for every job that does not fit."""

    __slots__ = ("_movers", "_on_node", "front", "gains", "ids", "jobs", "keys")

    def __init__(self, victims: Iterable[tuple[Key, RunningJob, Gains]]) -> None:
        self.keys: list[Key] = []
        self.jobs: list[RunningJob] = []
        self.ids: list[str] = []
        self.gains: list[Gains] = []
        for key, rj, gains in victims:
            self.keys.append(key)
            self.jobs.append(rj)
            self.ids.append(rj.job.id)
            self.gains.append(gains)
        self.front = 0  # the victims before it were preempted earlier in the pass
        self._movers: list[tuple[int, ...]] | None = None
        self._on_node: dict[int, list[tuple[int, int]]] | None = None

    @property
    def movers(self) -> list[tuple[int, ...]]:
        """Per victim: the nodes it frees GPUs on, last part first (made on first use)."""
        if self._movers is None:
            self._movers = [tuple(nid for nid, c in reversed(g) if c > 0) for g in self.gains]
        return self._movers

    @property
    def on_node(self) -> dict[int, list[tuple[int, int]]]:
        """Node -> (victim, GPUs it frees there), victims in ranking order (made on first
        use: only wide jobs that need many victims ask)."""
        if self._on_node is None:
            on_node: dict[int, list[tuple[int, int]]] = {}
            for j, gains in enumerate(self.gains):
                if len(gains) == 1:
                    nid, c = gains[0]
                    if c > 0:
                        on_node.setdefault(nid, []).append((j, c))
                    continue
                per_node: dict[int, int] = {}
                for nid, c in gains:
                    if c > 0:
                        per_node[nid] = per_node.get(nid, 0) + c
                for nid, c in per_node.items():
                    on_node.setdefault(nid, []).append((j, c))
            self._on_node = on_node
        return self._on_node

    def end(self, floor: Key) -> int:
        """Index of the first victim not ranked above ``floor`` (keys never increase)."""
        keys = self.keys
        lo, hi = 0, len(keys)
        while lo < hi:
            mid = (lo + hi) // 2
            if keys[mid] > floor:
                lo = mid + 1
            else:
                hi = mid
        return lo


class Release(NamedTuple):  # a NamedTuple, not a dataclass: thousands per pass
    """What ``release_plan`` or ``release_by_nodes`` decided. ``moved``: the nodes whose
    free count the one-by-one procedure changes at least once, in the order of their
    last change (``release_by_nodes`` leaves out nodes without free GPUs before and
    after: nothing reads the order of those); ``free``: the new free count of each node
    that ends up changed."""

    fits: bool
    evict: list[int]  # victims to preempt (indices into the GroupVictims), best-ranked last
    moved: list[int]
    free: dict[int, int]


def release_plan(
    free: Sequence[int],
    count_ge: Sequence[int],
    shape: Sequence[int],
    gv: GroupVictims,
    candidates: Iterable[int],
    limit: int | None = None,
) -> Release | None:
    """Fewest victims, worst-ranked first, that make ``shape`` fit; None if that takes
    more than ``limit`` of the ``candidates`` (the caller then looks by nodes).

    The rule, one victim at a time: release ``candidates`` (eligible victims, in
    ranking order) until the shape fits (``GroupFree.fits``: for every per-node count
    ``c`` at position ``i``, at least ``i + 1`` nodes with ``c`` free); then, from the
    next-to-last released victim back to the first, take each one back if the shape
    still fits without it. Here that runs on a dict of free counts and touches only
    what can matter: a victim whose GPUs all sit on nodes left with fewer free GPUs than
    the smallest count of the shape cannot change the answer, so it is kept back
    without a check. ``count_ge``: the group's nodes with at least ``f`` free, by ``f``;
    every count of ``shape`` must lie in 1..(len(count_ge) - 2).

    ``Release.moved`` reports the order in which the one-by-one procedure last changed
    each node's count: bucket order decides best fit, so the caller replays it
    (``Capacity.requeue``). With no fit every released victim is taken back in release
    order, which moves its nodes once more."""
    need: dict[int, int] = {}
    for i, c in enumerate(shape):
        need[c] = max(need.get(c, 0), i + 1)
    ts = sorted(need)
    tmin = ts[0]
    have = {t: count_ge[t] for t in ts}
    short = 0
    for t in ts:
        if have[t] < need[t]:
            short += 1
    gains = gv.gains
    cur: dict[int, int] = {}
    high: set[int] = set()  # nodes with at least ``tmin`` free once released
    released: list[int] = []
    most = len(gains) if limit is None else limit
    for j in candidates:
        if len(released) == most:
            return None
        released.append(j)
        for nid, c in gains[j]:
            f = cur.get(nid)
            if f is None:
                f = free[nid]
            nf = cur[nid] = f + c
            if nf >= tmin:
                high.add(nid)
                for t in ts:
                    if f < t <= nf:
                        have[t] += 1
                        if have[t] == need[t]:
                            short -= 1
        if not short:
            break
    else:
        if released or short:
            order = [nid for j in reversed(released) for nid, c in reversed(gains[j]) if c]
            return Release(fits=False, evict=[], moved=list(reversed(dict.fromkeys(order))), free={})
    evict = released[-1:]
    if len(released) > 1:
        # Only victims freeing GPUs on a high node can be needed; all others are kept.
        relevant = [j for j in released[:-1] if any(c and nid in high for nid, c in gains[j])]
        for j in reversed(relevant):
            for nid, c in gains[j]:
                f = cur[nid]
                nf = cur[nid] = f - c
                if f >= tmin:
                    for t in ts:
                        if nf < t <= f:
                            have[t] -= 1
                            if have[t] == need[t] - 1:
                                short += 1
            if short:  # needed after all: release it again
                for nid, c in gains[j]:
                    f = cur[nid]
                    nf = cur[nid] = f + c
                    if nf >= tmin:
                        for t in ts:
                            if f < t <= nf:
                                have[t] += 1
                                if have[t] == need[t]:
                                    short -= 1
                evict.append(j)
        evict.sort()
    new_free = _freed(free, gains, evict)
    order = [nid for j in released for nid, c in reversed(gains[j]) if c]
    return Release(fits=True, evict=evict, moved=list(reversed(dict.fromkeys(order))), free=new_free)


@dataclass(frozen=True, slots=True)
class Eligible:
    """The victims one waiting job may preempt: index below ``end``, id not in ``skip``
    (preempted earlier in the pass) and ``allowed`` (the policy's ``can_preempt``)."""

    gv: GroupVictims
    end: int
    skip: Container[str]
    allowed: Callable[[int], bool]

    def __call__(self, j: int) -> bool:
        return j < self.end and self.gv.ids[j] not in self.skip and self.allowed(j)

    def first_on(self, nid: int, last: int) -> int | None:
        """The first eligible victim up to ``last`` that frees GPUs on node ``nid``."""
        for j, _ in self.gv.on_node.get(nid, ()):
            if j > last:
                return None
            if self(j):
                return j
        return None


class Completions:
    """For one group and a free count ``t``: per node, a lower bound on the index of the
    victim whose release, after all eligible victims before it, leaves the node with
    ``t`` free GPUs. Kept as a heap across the pass: a bound only rises when the node's
    free count falls or victims leave, and ``refresh`` re-bounds the nodes whose count
    changed, so the few nodes that finish first are found without a scan of all victims.
    Stale entries are fixed when they come up; duplicates are skipped."""

    __slots__ = ("gv", "heap", "logged", "t")

    def __init__(
        self,
        gv: GroupVictims,
        t: int,
        nodes: Iterable[int],
        free: Sequence[int],
        skip: Container[str],
        changed: Sequence[int],
    ) -> None:
        self.gv = gv
        self.t = t
        self.logged = len(changed)  # entries of the caller's log of changed nodes already seen
        self.heap: list[tuple[int, int]] = []
        for nid in nodes:
            b = self.bound(nid, free[nid], skip)
            if b is not None:
                self.heap.append((b, nid))
        heapq.heapify(self.heap)

    def bound(self, nid: int, free_n: int, skip: Container[str]) -> int | None:
        need = self.t - free_n
        if need <= 0:
            return None  # counted by the group already
        ids = self.gv.ids
        for j, c in self.gv.on_node.get(nid, ()):
            if ids[j] not in skip:
                need -= c
                if need <= 0:
                    return j
        return None

    def refresh(self, changed: Sequence[int], free: Sequence[int], skip: Container[str]) -> None:
        """Re-bound the nodes whose free count changed since the last call (``changed``
        is the caller's whole log of them: only its new entries are read)."""
        for nid in changed[self.logged :]:
            b = self.bound(nid, free[nid], skip)
            if b is not None:
                heapq.heappush(self.heap, (b, nid))
        self.logged = len(changed)

    def first(self, k: int, free: Sequence[int], who: Eligible) -> list[tuple[int, int]] | None:
        """(index, node) of every node that reaches ``t`` no later than the ``k``-th one
        to (k >= 1), releasing ``who``'s victims in order; None if fewer than ``k`` do."""
        heap, t, skip = self.heap, self.t, who.skip
        on_node = self.gv.on_node
        local: list[tuple[int, int]] = []  # this job's exact indices, for popped nodes
        aside: list[tuple[int, int]] = []  # popped entries still valid: pushed back at the end
        seen: set[int] = set()
        found: list[tuple[int, int]] = []
        last = who.end
        while True:
            top = heap[0][0] if heap else last
            if local and local[0][0] <= top and local[0][0] < last:
                found.append(heapq.heappop(local))
                if len(found) == k:
                    last = found[-1][0] + 1  # ties with the k-th still count
                continue
            if top >= last:
                break
            b, nid = heapq.heappop(heap)
            if nid in seen:
                continue  # a duplicate: the node's current entry came up before
            exact = self.bound(nid, free[nid], skip)
            if exact is None:
                continue  # cannot reach t any more (re-bounded if its count changes)
            if exact > b:
                heapq.heappush(heap, (exact, nid))
                continue
            assert exact == b, "a change of free count was not refreshed"
            seen.add(nid)
            aside.append((b, nid))
            need = t - free[nid]
            for j, c in on_node[nid]:
                if j >= who.end:
                    break
                if who(j):
                    need -= c
                    if need <= 0:
                        heapq.heappush(local, (j, nid))
                        break
        for entry in aside:
            heapq.heappush(heap, entry)
        return found if len(found) >= k else None


def release_by_nodes(
    free: Sequence[int],
    have: int,
    shape: Sequence[int],
    found: list[tuple[int, int]],
    who: Eligible,
    occupied: Iterable[int],
) -> Release:
    """``release_plan`` for a shape of ``k`` equal counts ``t``, from the nodes that
    reach ``t`` first (``found``, from ``Completions.first``; ``have``: nodes at ``t``
    already, fewer than ``k``) instead of a scan of every victim before them. Only
    victims freeing GPUs on those nodes can be needed. ``moved`` lists only nodes with
    free GPUs before or after (``occupied``: the group's nodes with any free now): the
    order of nodes without free GPUs is never read (placements ask for at least one)."""
    gv = who.gv
    gains, on_node = gv.gains, gv.on_node
    t, k = shape[0], len(shape)
    last = found[-1][0]
    cur: dict[int, int] = {}
    relevant: set[int] = set()
    for _, nid in found:
        f = free[nid]
        for j, c in on_node[nid]:
            if j > last:
                break
            if who(j):
                f += c
                relevant.add(j)
        cur[nid] = f
    have += len(found)
    relevant.discard(last)
    evict = [last]
    for j in sorted(relevant, reverse=True):
        for nid, c in gains[j]:
            if nid in cur:
                f = cur[nid]
                nf = cur[nid] = f - c
                if nf < t <= f:
                    have -= 1
        if have < k:  # needed after all
            for nid, c in gains[j]:
                if nid in cur:
                    f = cur[nid]
                    nf = cur[nid] = f + c
                    if f < t <= nf:
                        have += 1
            evict.append(j)
    evict.sort()
    new_free = _freed(free, gains, evict)
    firsts = []  # (first released victim freeing GPUs there, its place in that victim's movers, node)
    for nid in dict.fromkeys(chain(occupied, new_free)):
        first = who.first_on(nid, last)
        if first is not None:
            firsts.append((first, gv.movers[first].index(nid), nid))
    firsts.sort(reverse=True)
    return Release(fits=True, evict=evict, moved=[nid for _, _, nid in firsts], free=new_free)


def _freed(free: Sequence[int], gains: Sequence[Gains], evict: list[int]) -> dict[int, int]:
    """Free count of every node that preempting ``evict`` changes, once they are gone."""
    out: dict[int, int] = {}
    for j in evict:
        for nid, c in gains[j]:
            if c:
                out[nid] = out.get(nid, free[nid]) + c
    return out
