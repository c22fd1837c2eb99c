"""Free-GPU bookkeeping for one scheduling pass.

A *group* is the set of schedulable nodes of one pool and one GPU model: a gang never
spans two groups (no mixing of models inside one job). Per group the pass keeps, for
every free-count ``f``, the nodes with exactly ``f`` free GPUs (``by_free``) and how many
nodes have at least ``f`` free (``count_ge``). With those, "does a 3 x 8-GPU gang fit?"
is an O(1) check and best-fit is a short scan, which is what keeps a pass over 10,000
pending jobs fast.

This module is mutable on purpose: it is the scratch pad of one ``plan()`` call and never
escapes it. The static part of a fleet (``FleetIndex``) is derived once per Fleet object.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpufleet.scheduler.model import Fleet, RunningJob

GroupKey = tuple[str, str]  # (pool, GPU model)
Holdings = dict[GroupKey, list[tuple[int, tuple[int, ...]]]]  # group -> [(node id, GPU indices)]
Flat = tuple[tuple[int, int], ...]  # (node id, countable GPUs)


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
    """The static facts of a Fleet, computed once per Fleet object."""

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
        self.pools = {k[0] for k in self.groups}
        self.models = {k[1] for k in self.groups}

    def holdings(self, rj: RunningJob) -> tuple[Holdings, dict[GroupKey, int]]:
        """A running job's GPUs per schedulable group (node ids, indices) and how many of
        them count as capacity. Memoised per RunningJob object: it is immutable and the
        index belongs to one fleet."""
        hit = self._holdings.get(id(rj))
        if hit is None or hit[0] is not rj:
            hit = self._hold(rj)
        return hit[1], hit[2]

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


_INDEX_CACHE: dict[int, tuple[Fleet, FleetIndex]] = {}


def fleet_index(fleet: Fleet) -> FleetIndex:
    """Memoised FleetIndex. Keyed by identity (a strong reference is kept, so the id
    cannot be reused); callers that keep one Fleet object across passes, like the
    simulator, pay for the index once."""
    hit = _INDEX_CACHE.get(id(fleet))
    if hit is not None and hit[0] is fleet:
        return hit[1]
    index = FleetIndex(fleet)
    if len(_INDEX_CACHE) >= 8:
        _INDEX_CACHE.pop(next(iter(_INDEX_CACHE)))
    _INDEX_CACHE[id(fleet)] = (fleet, index)
    return index


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

    def __init__(
        self, index: FleetIndex, free: list[int], running: Sequence[RunningJob] | None = None
    ) -> None:
        self.index = index
        self.free = free
        self._running = running  # None: a count-only copy that tracks no GPU indices
        self._used: dict[int, set[int]] | None = None
        self.groups = {key: GroupFree(info, free) for key, info in index.groups.items()}

    @classmethod
    def build(cls, index: FleetIndex, running: Sequence[RunningJob]) -> Capacity:
        """Free counts from the running jobs' holdings; which GPU indices are taken is
        worked out only if this pass allocates or releases GPUs (most passes do not)."""
        free = list(index.base_free)
        flat = index.flat_holdings
        for rj in running:
            for nid, n in flat(rj):
                free[nid] -= n
        return cls(index, [f if f > 0 else 0 for f in free], running)

    @property
    def used(self) -> dict[int, set[int]] | None:
        """Node id -> allocated GPU indices (None in count-only copies)."""
        if self._used is None and self._running is not None:
            used: dict[int, set[int]] = {}
            holdings = self.index.holdings
            for rj in self._running:
                for parts in holdings(rj)[0].values():
                    for nid, gpus in parts:
                        used.setdefault(nid, set()).update(gpus)
            self._used = used
        return self._used

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

    def take(self, nid: int, count: int, gpus: Sequence[int] | None = None) -> tuple[int, ...]:
        """Allocate ``count`` GPUs on a node; returns the indices (empty in count mode)."""
        chosen: tuple[int, ...] = ()
        used = self.used
        if used is not None:
            taken = used.setdefault(nid, set())
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
        used = self.used
        if used is not None:
            used.get(nid, set()).difference_update(gpus)

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
