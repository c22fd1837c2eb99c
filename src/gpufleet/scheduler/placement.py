"""Topology-aware gang placement: which nodes, then which GPUs.

Rules, in order of importance:

1. Gang: all of a job's GPUs or none, all of one GPU model and pool (one group).
2. Fewest nodes: a job that fits on one node gets one node; a wider job takes whole
   nodes (``job_shape``), unless it pinned ``gpus_per_node`` or ``nodes``.
3. Locality: a multi-node gang goes under one leaf switch if any leaf can hold it, else
   inside one rack, else over the fewest leaves. Inside a node, one NVLink domain.
4. Spread: a one-node job of a spread group (``JobRequest.spread``) avoids nodes, then
   leaves, that already hold a job of its group (``choose_spread``).
5. Best fit: among equally local choices, the nodes whose free GPUs the job fills most
   completely, so that whole nodes stay whole for the next wide job.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.migindex import SHARE_UNITS, physical_node
from gpufleet.scheduler import sharing
from gpufleet.scheduler.capacity import Capacity, GroupFree, GroupKey
from gpufleet.scheduler.model import JobRequest, NodeGpus, Placement

Shape = tuple[int, ...]  # GPUs per node, sorted descending
NodeCounts = list[tuple[int, int]]  # (node id, GPUs)


def job_shape(job: JobRequest, node_size: int) -> Shape | str:
    """The per-node split of ``job`` on nodes of ``node_size`` GPUs, or why it has none."""
    gpus = job.gpus
    if gpus <= 0:
        return f"asks for {gpus} GPUs"
    if job.gpus_per_node:
        per = job.gpus_per_node
        if gpus % per:
            return f"{gpus} GPUs do not split into {per} per node"
        if job.nodes and job.nodes * per != gpus:
            return f"{job.nodes} nodes x {per} GPUs is not {gpus} GPUs"
    elif job.nodes:
        if gpus % job.nodes:
            return f"{gpus} GPUs do not split evenly over {job.nodes} nodes"
        per = gpus // job.nodes
    elif gpus <= node_size:
        return (gpus,)
    else:
        full, rest = divmod(gpus, node_size)
        return (node_size,) * full + ((rest,) if rest else ())
    if per > node_size:
        return f"{per} GPUs per node, but nodes have at most {node_size}"
    return (per,) * (gpus // per)


def describe_shape(shape: Shape) -> str:
    total = sum(shape)
    if len(shape) == 1:
        return f"{total} GPUs on 1 node"
    if len(set(shape)) == 1:
        return f"{total} GPUs on {len(shape)} nodes ({shape[0]} per node)"
    return f"{total} GPUs on {len(shape)} nodes ({'+'.join(map(str, shape))})"


def choose_nodes(cap: Capacity, key: GroupKey, shape: Shape) -> NodeCounts | None:
    """Nodes (and GPU counts) for ``shape`` in group ``key``; None if it does not fit."""
    group = cap.groups[key]
    if not group.fits(shape):
        return None
    if len(shape) == 1:
        nid = group.best_fit_node(shape[0])
        return None if nid is None else [(nid, shape[0])]
    return _choose_multi(cap, group, shape)


def share_ask(units: int) -> sharing.Ask:
    """A share of ``units`` (``migindex.SHARE_UNITS`` make a GPU) as ``sharing``'s ask."""
    milli = units * (sharing.WHOLE // SHARE_UNITS)
    return sharing.Ask() if milli >= sharing.WHOLE else sharing.Ask(milli=milli)


def choose_share(cap: Capacity, key: GroupKey, count: int, frag: sharing.Fragmentation) -> NodeCounts | None:
    """One shared GPU (a share node of group ``key``) for ``count`` units, chosen by
    ``sharing.place``'s ``fgd`` rule over the group's shared GPUs, grouped by the node they
    are on, for the waiting shares' mix (``frag``): the place that least increases the
    expected fragmentation (FGD, Weng et al., USENIX ATC'23), best fit on ties. The rule
    the simulator and ``bench/bench_sharing.py`` measure is this one; here it sees the
    shared GPUs' room only (a share node holds no CPUs: the CPUs a share's job asks are
    not part of its ask, as the bench's ``gpu-only`` mix)."""
    group = cap.groups[key]
    info = cap.index.nodes
    at: dict[str, int] = {}
    names: list[str] = []
    free: list[list[int]] = []
    nids: list[list[int]] = []
    step = sharing.WHOLE // SHARE_UNITS
    for nid in group.info.nodes:
        node = physical_node(info[nid].name)
        i = at.get(node)
        if i is None:
            i = at[node] = len(names)
            names.append(node)
            free.append([])
            nids.append([])
        free[i].append(cap.free[nid] * step)
        nids[i].append(nid)
    choice = sharing.place(sharing.Shares(names=names, free=free), share_ask(count), "fgd", frag)
    return None if choice is None else [(nids[choice.node][choice.gpus[0]], count)]


def choose_spread(
    cap: Capacity, key: GroupKey, count: int, *, nodes: set[int], leaves: set[str]
) -> NodeCounts | None:
    """One node for ``count`` GPUs in group ``key``, apart from its spread group: the
    tightest node under a leaf holding none of the group, else the tightest node holding
    none, else (every fitting node holds one) the tightest node. None if none fits."""
    group = cap.groups[key]
    info = cap.index.nodes
    apart: int | None = None
    for _free, nid in group.candidates(count):
        if nid in nodes:
            continue
        if info[nid].leaf not in leaves:
            return [(nid, count)]
        if apart is None:
            apart = nid
    if apart is not None:
        return [(apart, count)]
    best = group.best_fit_node(count)
    return None if best is None else [(best, count)]


def _choose_multi(cap: Capacity, group: GroupFree, shape: Shape) -> NodeCounts | None:
    """Scan nodes tightest-first; the first leaf that collects a gang wins (so the gang
    gets one leaf, on the fullest nodes that can hold it). Only when no leaf can hold it:
    the rack with the least waste, else the roomiest leaves first."""
    nodes = cap.index.nodes
    by_leaf: dict[str, list[tuple[int, int]]] = {}
    everything: list[tuple[int, int]] = []
    for free, nid in group.candidates(shape[-1]):
        cands = by_leaf.setdefault(nodes[nid].leaf, [])
        cands.append((free, nid))
        everything.append((free, nid))
        if len(cands) >= len(shape):
            got = _assign(shape, cands)
            if got is not None:
                return got[1]
    by_rack: dict[str, list[tuple[int, int]]] = {}
    for free, nid in everything:
        by_rack.setdefault(nodes[nid].rack, []).append((free, nid))
    best: tuple[int, str, NodeCounts] | None = None
    for name, cands in sorted(by_rack.items()):
        got = _assign(shape, cands)
        if got is not None and (best is None or got[0] < best[0]):
            best = (got[0], name, got[1])
    if best is not None:
        return best[2]
    room = {leaf: sum(f for f, _ in cands) for leaf, cands in by_leaf.items()}
    everything.sort(key=lambda fn: (-room[nodes[fn[1]].leaf], nodes[fn[1]].leaf, fn[0], fn[1]))
    got = _assign(shape, everything, best_fit=False)
    return None if got is None else got[1]


def _assign(
    shape: Shape, cands: list[tuple[int, int]], *, best_fit: bool = True
) -> tuple[int, NodeCounts] | None:
    """Give each per-node count (largest first) the tightest unused candidate.

    Returns (left-over free GPUs on the chosen nodes, assignment) or None.
    """
    if len(cands) < len(shape):
        return None
    pool = sorted(cands) if best_fit else list(cands)
    used = [False] * len(pool)
    out: NodeCounts = []
    waste = 0
    for c in shape:
        for i, (free, nid) in enumerate(pool):
            if not used[i] and free >= c:
                used[i] = True
                out.append((nid, c))
                waste += free - c
                break
        else:
            return None
    return waste, out


def commit(cap: Capacity, counts: Iterable[tuple[int, int]]) -> Placement:
    """Take the GPUs for a chosen set of nodes; returns the exact placement."""
    names = cap.index.nodes
    return tuple(NodeGpus(node=names[nid].name, gpus=cap.take(nid, c)) for nid, c in counts)
