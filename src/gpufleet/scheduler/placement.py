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


ShareMix = tuple[tuple[int, float], ...]
"""The waiting GPU shares' sizes (units) and their weights: what room on a shared GPU is
worth keeping (``choose_share``)."""


def choose_share(cap: Capacity, key: GroupKey, count: int, mix: ShareMix) -> NodeCounts | None:
    """One shared GPU (a share node of group ``key``) for ``count`` units. A GPU already
    in use before an untouched one (an untouched GPU stays whole for the big shares); among
    those in use, the way FGD (Weng et al., "Beware of Fragmentation", USENIX ATC'23)
    places a GPU fraction: the GPU whose *stranded* room for the waiting mix grows least. A
    GPU's room ``f`` is stranded for an ask larger than ``f``; its expected stranding is
    ``f x P(ask > f)`` over ``mix``. Taking ``count`` of ``f`` changes it by
    ``stranded(f - count) - stranded(f)``: filling a GPU's room exactly, or down to a size
    the waiting shares still use, scores best. Ties go to best fit (the fullest GPU),
    which is also the choice without a mix."""
    group = cap.groups[key]
    size = group.info.size
    in_use_fits = count < size and group.count_ge[count] > group.count_ge[size]
    top = size - 1 if in_use_fits else size
    best: tuple[float, int] | None = None
    for f in range(count, top + 1):
        bucket = group.by_free[f]
        if not bucket:
            continue
        score = _stranded(f - count, mix) - _stranded(f, mix)
        if best is None or score < best[0] - 1e-9:
            best = (score, next(iter(bucket)))
    return None if best is None else [(best[1], count)]


def _stranded(free: int, mix: ShareMix) -> float:
    return free * sum(p for size, p in mix if size > free)


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
