"""Free-GPU bookkeeping for one scheduling pass.

A *group* is the set of schedulable nodes of one pool and one GPU model: a gang never
spans two groups (no mixing of models inside one job). Per group the pass keeps, for
every free-count ``f``, the nodes with exactly ``f`` free GPUs (``by_free``) and how many
nodes have at least ``f`` free (``count_ge``). With those, "does a 3 x 8-GPU gang fit?"
is an O(1) check and best-fit is a short scan, which is what keeps a pass over 10,000
pending jobs fast.

This module is mutable on purpose: it is the scratch pad of one ``plan()`` call and never
escapes it. The static part of a fleet (``FleetIndex``) is derived once per Fleet object
and kept by the caller's ``PlanCache`` (cache.py), with the memos that follow it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, filterfalse
from operator import is_
from typing import Any, TypeVar

from gpufleet.scheduler.model import Fleet, RunningJob

GroupKey = tuple[str, str]  # (pool, GPU model)
Holdings = dict[GroupKey, list[tuple[int, tuple[int, ...]]]]  # group -> [(node id, GPU indices)]
Flat = tuple[tuple[int, int], ...]  # (node id, countable GPUs)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class NodeInfo:
    id: int
    name: str
    group: GroupKey | None  # None: not schedulable (cordoned, not ready)
    healthy: tuple[int, ...]  # GPU indices that may be allocated
    healthy_set: frozenset[int]
    all_healthy: bool
    domain_of: dict[int, int]
    leaf: str
    rack: str


@dataclass(frozen=True, slots=True)
class GroupInfo:
    key: GroupKey
    nodes: tuple[int, ...]
    size: int  # most healthy GPUs on one node of the group
    capacity: int  # healthy GPUs in the group
    capacity_ge: tuple[int, ...]  # [f] -> nodes with >= f healthy GPUs


class FleetIndex:
    """The static facts of a Fleet, computed once per Fleet object, and the memos that
    follow that fleet from pass to pass (holdings, last occupancy, options, per-policy
    state). Owned by one ``PlanCache`` (one caller, one thread), or by one pass when
    the caller keeps none."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.nodes: list[NodeInfo] = []
        self.id_of: dict[str, int] = {}
        members: dict[GroupKey, list[int]] = {}
        for nid, node in enumerate(fleet.nodes):
            healthy = tuple(sorted(g.index for g in node.gpus if g.healthy))
            key: GroupKey | None = (node.pool, node.model) if node.schedulable and healthy else None
            self.nodes.append(
                NodeInfo(
                    id=nid,
                    name=node.name,
                    group=key,
                    healthy=healthy,
                    healthy_set=frozenset(healthy),
                    all_healthy=len(healthy) == len(node.gpus),
                    domain_of={g.index: g.nvlink_domain for g in node.gpus},
                    leaf=node.leaf,
                    rack=node.rack,
                )
            )
            self.id_of[node.name] = nid
            if key is not None:
                members.setdefault(key, []).append(nid)
        self.groups: dict[GroupKey, GroupInfo] = {}
        for key, nids in members.items():
            sizes = [len(self.nodes[n].healthy) for n in nids]
            size = max(sizes)
            self.groups[key] = GroupInfo(
                key=key,
                nodes=tuple(nids),
                size=size,
                capacity=sum(sizes),
                capacity_ge=tuple(sum(1 for s in sizes if s >= f) for f in range(size + 1)),
            )
        self.base_free = [len(n.healthy) if n.group is not None else 0 for n in self.nodes]
        self._holdings: dict[int, tuple[RunningJob, Holdings, dict[GroupKey, int], Flat]] = {}
        self._occupancy: Occupancy | None = None
        self._per_policy: dict[int, tuple[object, object]] = {}
        self.options_memo: dict[tuple[object, ...], Any] = {}  # core.shared_options
        self.pools = {k[0] for k in self.groups}
        self.models = {k[1] for k in self.groups}

    def occupancy(self, running: Sequence[RunningJob]) -> Occupancy:
        """What ``running`` holds. The last result is kept: a caller that hands in
        mostly the same RunningJob objects pass after pass (the simulator) gets it
        derived from the difference instead of recounted. Results are never mutated
        once published, so concurrent passes may share them."""
        # Every step here is a C loop over ``running``: this runs in every pass (~180,000
        # of them in a 100k-job replay), and a dict built from scratch costs more than all
        # the rest together.
        last = self._occupancy
        if last is not None and last.running is not None and isinstance(running, tuple):
            occ = self._derive_in_order(last, last.running, running)
            if occ is not None:
                self._occupancy = occ
                return occ
        ids = set(map(id, running))
        if len(ids) != len(running):  # the same object twice: count it twice, cache nothing
            return self._occupy(running, {})
        if last is not None:
            gone_ids = last.jobs.keys() - ids
            new_ids = ids - last.jobs.keys()
            if len(gone_ids) + len(new_ids) < len(ids):
                gone = [last.jobs[i] for i in gone_ids]
                new = list(compress(running, map(new_ids.__contains__, map(id, running))))
                jobs = last.jobs.copy()
                for i in gone_ids:
                    del jobs[i]
                for rj in new:
                    jobs[id(rj)] = rj
                occ = last.derive(self, gone, new, jobs)
                occ.running = running if isinstance(running, tuple) else None
                self._occupancy = occ
                return occ
        occ = self._occupy(running, dict(zip(map(id, running), running, strict=True)))
        occ.running = running if isinstance(running, tuple) else None
        self._occupancy = occ
        return occ

    def _derive_in_order(
        self, last: Occupancy, before: tuple[RunningJob, ...], running: tuple[RunningJob, ...]
    ) -> Occupancy | None:
        """The common case, cheaply: ``running`` is the last pass's jobs with a few
        removed and some appended (the simulator keeps its running jobs in start order).
        None when that takes more than a few removals or ``running`` repeats a job."""
        diff = _ordered_diff(before, running, limit=16)
        if diff is None:
            return None
        gone, new = diff
        jobs = last.jobs.copy()
        for rj in gone:
            del jobs[id(rj)]
        for rj in new:
            if id(rj) in jobs:
                return None  # the same object twice: let the general path see it
            jobs[id(rj)] = rj
        occ = last.derive(self, gone, new, jobs)
        occ.running = running
        return occ

    def _occupy(self, running: Sequence[RunningJob], jobs: dict[int, RunningJob]) -> Occupancy:
        occ = Occupancy(jobs, list(self.base_free), {}).derive(self, (), running, jobs)
        occ.parent = 0  # counted afresh: derived from nothing a cache could hold
        return occ

    def policy_state(self, policy: object, make: Callable[[], T]) -> T:
        """State that one policy object keeps along this index's occupancies from pass
        to pass (see victims.py); made on first use, a few policies at most."""
        hit = self._per_policy.get(id(policy))
        if hit is None or hit[0] is not policy:
            if len(self._per_policy) >= 8:
                self._per_policy.clear()
            hit = self._per_policy[id(policy)] = (policy, make())
        return hit[1]  # type: ignore[return-value]

    def holdings(self, rj: RunningJob) -> tuple[Holdings, dict[GroupKey, int]]:
        """A running job's GPUs per schedulable group (node ids, indices) and how many of
        them count as capacity. Memoised per RunningJob object: it is immutable and the
        index belongs to one fleet."""
        hit = self._holdings.get(id(rj))
        if hit is None or hit[0] is not rj:
            hit = self._hold(rj)
        return hit[1], hit[2]

    def holdings_and_flat(self, rj: RunningJob) -> tuple[Holdings, dict[GroupKey, int], Flat]:
        """``holdings`` and ``flat_holdings`` with one look-up."""
        hit = self._holdings.get(id(rj))
        if hit is None or hit[0] is not rj:
            hit = self._hold(rj)
        return hit[1], hit[2], hit[3]

    def flat_holdings(self, rj: RunningJob) -> Flat:
        """(node id, countable GPUs) of a running job on schedulable nodes."""
        hit = self._holdings.get(id(rj))
        if hit is None or hit[0] is not rj:
            hit = self._hold(rj)
        return hit[3]

    def _hold(self, rj: RunningJob) -> tuple[RunningJob, Holdings, dict[GroupKey, int], Flat]:
        parts: Holdings = {}
        count: dict[GroupKey, int] = {}
        flat: list[tuple[int, int]] = []
        for part in rj.placement:
            nid = self.id_of.get(part.node)
            if nid is None:
                continue
            info = self.nodes[nid]
            if info.group is None:
                continue
            parts.setdefault(info.group, []).append((nid, part.gpus))
            n = len(part.gpus) if info.all_healthy else sum(1 for g in part.gpus if g in info.healthy_set)
            count[info.group] = count.get(info.group, 0) + n
            flat.append((nid, n))
        if len(self._holdings) > 100_000:
            self._holdings.clear()
        hit = self._holdings[id(rj)] = (rj, parts, count, tuple(flat))
        return hit


class Occupancy:
    """GPUs held by a set of running jobs (kept by object identity, which also keeps the
    ids from being reused): free GPUs per node before clamping at 0, and per node how
    many jobs hold each GPU index (a count, so two jobs wrongly sharing a GPU are
    undone exactly). ``parent``, ``gone`` and ``new`` say what it was derived from (the
    id of that Occupancy, 0 for none) and how it differs, for caches that follow it."""

    __slots__ = ("free", "gone", "jobs", "new", "parent", "running", "used")

    def __init__(self, jobs: dict[int, RunningJob], free: list[int], used: dict[int, dict[int, int]]) -> None:
        self.jobs = jobs
        self.free = free
        self.used = used
        self.parent = 0
        self.gone: Sequence[RunningJob] = ()
        self.new: Sequence[RunningJob] = ()
        self.running: tuple[RunningJob, ...] | None = None  # as handed in, if no job repeats

    def derive(
        self,
        index: FleetIndex,
        gone: Sequence[RunningJob],
        new: Sequence[RunningJob],
        jobs: dict[int, RunningJob],
    ) -> Occupancy:
        """A new Occupancy without ``gone`` and with ``new``; this one is left as it is."""
        free = list(self.free)
        used = dict(self.used)
        copied: set[int] = set()
        for sign, batch in ((-1, gone), (1, new)):
            for rj in batch:
                for nid, n in index.flat_holdings(rj):
                    free[nid] -= sign * n
                for parts in index.holdings(rj)[0].values():
                    for nid, gpus in parts:
                        if nid in copied:
                            held = used[nid]
                        else:
                            prev = used.get(nid)
                            held = used[nid] = dict(prev) if prev else {}
                            copied.add(nid)
                        for g in gpus:
                            c = held.get(g, 0) + sign
                            if c:
                                held[g] = c
                            else:
                                del held[g]
        occ = Occupancy(jobs, free, used)
        occ.parent, occ.gone, occ.new = id(self), gone, new
        return occ


def _ordered_diff(
    old: tuple[RunningJob, ...], new: tuple[RunningJob, ...], *, limit: int
) -> tuple[list[RunningJob], list[RunningJob]] | None:
    """(removed, added) such that ``new`` is ``old`` without the removed objects (order
    kept) plus the added ones, found by identity with C-level scans: each removal costs
    one scan of what follows it. None after ``limit`` removals. Always exact: an object
    that moved shows up as removed and added again."""
    removed: list[RunningJob] = []
    i = j = 0
    while i < len(old):
        m = min(len(old) - i, len(new) - j)
        same = list(map(is_, old[i : i + m], new[j : j + m]))
        k = same.index(False) if False in same else m
        i += k
        j += k
        if i == len(old):
            break
        removed.append(old[i])
        i += 1
        if len(removed) > limit:
            return None
    return removed, list(new[j:])


class GroupFree:
    """Free-count buckets of one group (see module docstring)."""

    __slots__ = ("by_free", "count_ge", "info", "total")

    def __init__(self, info: GroupInfo, free: Sequence[int]) -> None:
        self.info = info
        self.by_free: list[dict[int, None]] = [{} for _ in range(info.size + 1)]
        counts = [0] * (info.size + 2)
        total = 0
        for nid in info.nodes:
            f = free[nid]
            self.by_free[f][nid] = None
            counts[f] += 1
            total += f
        ge = [0] * (info.size + 2)
        for f in range(info.size, -1, -1):
            ge[f] = ge[f + 1] + counts[f]
        self.count_ge = ge
        self.total = total

    def move(self, nid: int, old: int, new: int) -> None:
        """To the end of bucket ``new`` (also when ``new == old``). ``recount``
        inlined: this runs for every allocation."""
        del self.by_free[old][nid]
        self.by_free[new][nid] = None
        self.total += new - old
        ge = self.count_ge
        if new < old:
            for f in range(new + 1, old + 1):
                ge[f] -= 1
        else:
            for f in range(old + 1, new + 1):
                ge[f] += 1

    def recount(self, old: int, new: int) -> None:
        """Totals after one node went from ``old`` to ``new`` free (buckets aside)."""
        self.total += new - old
        ge = self.count_ge
        if new < old:
            for f in range(new + 1, old + 1):
                ge[f] -= 1
        else:
            for f in range(old + 1, new + 1):
                ge[f] += 1

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether enough nodes have enough free GPUs for ``shape`` (sorted descending).

        Hall's condition on a threshold structure: the i-th largest per-node count needs
        at least i+1 nodes with that many free GPUs.
        """
        ge = self.count_ge
        size = self.info.size
        for i, c in enumerate(shape):
            if c > size or ge[c] < i + 1:
                return False
        return True

    def largest_block(self) -> int:
        for f in range(self.info.size, 0, -1):
            if self.by_free[f]:
                return f
        return 0

    def best_fit_node(self, count: int) -> int | None:
        for f in range(count, self.info.size + 1):
            bucket = self.by_free[f]
            if bucket:
                return next(iter(bucket))
        return None

    def candidates(self, min_free: int) -> Iterable[tuple[int, int]]:
        """(free, node) for nodes with at least ``min_free`` free, fullest first."""
        for f in range(min_free, self.info.size + 1):
            for nid in self.by_free[f]:
                yield f, nid


class Capacity:
    """Free GPUs of every schedulable node, by count and (optionally) by index.

    ``counts_copy()`` gives a count-only copy, used by the estimator and the views to
    play with counts without caring which GPU indices are taken.
    """

    def __init__(self, index: FleetIndex, free: list[int], occupancy: Occupancy | None = None) -> None:
        self.index = index
        self.free = free
        self.occupancy = occupancy  # None: a count-only copy that tracks no GPU indices
        self._taken: dict[int, set[int]] = {}
        self.groups = {key: GroupFree(info, free) for key, info in index.groups.items()}

    @classmethod
    def build(cls, index: FleetIndex, running: Sequence[RunningJob]) -> Capacity:
        """Free counts from the running jobs' holdings; which GPU indices are taken is
        worked out per node, only for nodes where this pass allocates or releases."""
        occ = index.occupancy(running)
        return cls(index, [f if f > 0 else 0 for f in occ.free], occ)

    def taken(self, nid: int) -> set[int] | None:
        """Allocated GPU indices of a node (None in count-only copies)."""
        hit = self._taken.get(nid)
        if hit is None:
            if self.occupancy is None:
                return None
            held = self.occupancy.used.get(nid)
            hit = self._taken[nid] = set(held) if held else set()
        return hit

    def counts_copy(self) -> Capacity:
        return Capacity(self.index, list(self.free))

    @property
    def total_free(self) -> int:
        return sum(g.total for g in self.groups.values())

    def set_free(self, nid: int, new: int) -> None:
        key = self.index.nodes[nid].group
        if key is None:
            return
        old = self.free[nid]
        if old != new:
            self.free[nid] = new
            self.groups[key].move(nid, old, new)

    def requeue(self, key: GroupKey, nodes: Sequence[int], new: Mapping[int, int]) -> None:
        """Leave group ``key`` as if each of ``nodes`` (distinct, of that group), in
        turn, had moved out of its bucket and back in at the end of the bucket of its new
        free count (``new``, default: its count now). That is the net effect of a series
        of ``set_free`` calls whose last changes came in that order: bucket order is what
        best fit sees first. Many nodes: each bucket is rebuilt once, at C speed."""
        group = self.groups[key]
        free = self.free
        if len(nodes) <= 16:
            for nid in nodes:
                old = free[nid]
                f = free[nid] = new.get(nid, old)
                group.move(nid, old, f)
            return
        moving = set(nodes)
        by_free = group.by_free
        for f in {free[nid] for nid in nodes}.union(new.values()):
            by_free[f] = dict.fromkeys(filterfalse(moving.__contains__, by_free[f]))
        for nid, f in new.items():
            old = free[nid]
            if f != old:
                group.recount(old, f)
                free[nid] = f
        for nid in nodes:
            by_free[free[nid]][nid] = None

    def take(self, nid: int, count: int, gpus: Sequence[int] | None = None) -> tuple[int, ...]:
        """Allocate ``count`` GPUs on a node; returns the indices (empty in count mode)."""
        chosen: tuple[int, ...] = ()
        taken = None if self.occupancy is None else self.taken(nid)
        if taken is not None:
            if gpus is None:
                info = self.index.nodes[nid]
                available = [g for g in info.healthy if g not in taken]
                chosen = pick_gpus(available, count, info.domain_of)
            else:
                chosen = tuple(gpus)
            taken.update(chosen)
        self.set_free(nid, self.free[nid] - count)
        return chosen

    def give(self, nid: int, count: int) -> None:
        """Return ``count`` GPUs of a node to the free counts (see ``forget``)."""
        self.set_free(nid, self.free[nid] + count)

    def forget(self, nid: int, gpus: Sequence[int]) -> None:
        """The indices ``gpus`` of a node are no longer allocated (counts unchanged:
        callers ``give`` them back first, possibly tentatively)."""
        taken = self.taken(nid)
        if taken is not None:
            taken.difference_update(gpus)

    def countable(self, nid: int, gpus: Sequence[int]) -> int:
        """How many of ``gpus`` on node ``nid`` count as capacity (healthy, schedulable)."""
        info = self.index.nodes[nid]
        if info.group is None:
            return 0
        if info.all_healthy:
            return len(gpus)
        return sum(1 for g in gpus if g in info.healthy_set)


def pick_gpus(available: Sequence[int], count: int, domain_of: dict[int, int]) -> tuple[int, ...]:
    """Choose ``count`` GPUs on one node, keeping a job inside one NVLink domain when it
    can (the smallest domain that fits: best fit), else spanning the fewest domains."""
    if count >= len(available):
        return tuple(available[:count])
    domains: dict[int, list[int]] = {}
    for g in available:
        domains.setdefault(domain_of.get(g, 0), []).append(g)
    if len(domains) == 1:
        return tuple(available[:count])
    fitting = [(len(gs), d) for d, gs in domains.items() if len(gs) >= count]
    if fitting:
        _, d = min(fitting)
        return tuple(domains[d][:count])
    chosen: list[int] = []
    for _, d in sorted(((-len(gs), d) for d, gs in domains.items())):
        chosen.extend(domains[d][: count - len(chosen)])
        if len(chosen) == count:
            break
    return tuple(sorted(chosen))
