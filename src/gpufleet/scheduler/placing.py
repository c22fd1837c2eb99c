"""The placement step of a pass: which view of free capacity a job may use, and taking
GPUs in it.

A job places inside its own active reservation first, then (unless it named one) in
its general view: free GPUs less those reserved for others and, for EASY backfill's
long jobs, less what the reserved head job needs (``reservations.py``). Nodes where
its CPUs or memory do not fit now, or that its constraint rules out, are hidden from
the view; the choice inside it is ``placement.py``'s (topology-aware best fit, spread
groups, GPU shares). ``take`` commits a choice to the pass's capacity and keeps the
reservation views and the backfill shadow in step; the preemption step takes through
it too.
"""

from __future__ import annotations

from gpufleet.migindex import is_share_model, wants_share
from gpufleet.scheduler import sharing
from gpufleet.scheduler.capacity import Capacity, GroupKey
from gpufleet.scheduler.cycle import CycleState
from gpufleet.scheduler.features import NodeFilter, node_filters
from gpufleet.scheduler.model import JobRequest, Placement
from gpufleet.scheduler.options import Options
from gpufleet.scheduler.placement import (
    NodeCounts,
    Shape,
    choose_nodes,
    choose_share,
    choose_spread,
    commit,
    share_ask,
)
from gpufleet.scheduler.reservations import ViewSpec

__all__ = ["cap_fits", "general_view", "is_long", "place", "reservation_wait", "take"]


def place(cs: CycleState, job: JobRequest, opts: Options, limit: float) -> Placement | None:
    """Inside the job's own active reservation first, then (unless it named one) in
    its general view: free GPUs less those reserved for others, and for EASY
    backfill's long jobs, less what the reserved head job needs."""
    tries: list[NodeFilter | None] = [*node_filters(job)] or [None]
    if cs.power is not None:
        cs.power.hit = False
        if cs.power.dry(cs.cap.free):  # no node with a free GPU has power for one more
            cs.power.hit = True
            return None
    for only in tries:  # a [a|b] constraint: each alternative in turn
        placement = _place_filtered(cs, job, opts, limit, only)
        if placement is not None:
            return placement
    return None


def _place_filtered(
    cs: CycleState, job: JobRequest, opts: Options, limit: float, only: NodeFilter | None
) -> Placement | None:
    book = cs.book
    own = book.owned_active(job) if book else None
    spread = job.spread
    if own is not None:
        view = _fitting(cs, book.view(ViewSpec(own=own.id)), opts, job, only)
        placement = _place_in(cs, view, opts, own=own.id, spread=spread)
        if placement is not None or job.reservation is not None:
            return placement
    elif job.reservation is not None:
        return None
    view = _fitting(cs, general_view(cs, job, limit), opts, job, only)
    return _place_in(cs, view, opts, long=is_long(cs, limit), spread=spread)


def _fitting(
    cs: CycleState, view: Capacity, opts: Options, job: JobRequest, only: NodeFilter | None
) -> Capacity:
    """``view`` without the free GPUs of nodes where ``job``'s CPUs or memory do not
    fit now, or that its ``--constraint``/``--exclude`` rule out (``only``), and with
    no more free GPUs on a node than its rack's power budget feeds (a copy, only when
    there are such nodes)."""
    res = cs.res
    sized = res is not None and bool(job.cpus or job.mem_mb)
    capped = cs.power.mask(cs.index, view, opts) if cs.power is not None and cs.power.tight else []
    if not sized and only is None:
        return _capped(view, capped)
    index = cs.index
    nodes = index.nodes
    lacking = [
        nid
        for gk, _ in opts
        for nid in index.groups[gk].nodes
        if view.free[nid]
        and (
            (only is not None and not only(index.fleet.nodes[nid]))
            or (sized and res is not None and not res.fits(nodes[nid].name, job))
        )
    ]
    if not lacking:
        return _capped(view, capped)
    cs.masked = True
    copy = view.counts_copy()
    for nid in lacking:
        copy.set_free(nid, 0)
    return _capped(copy, capped, copied=True)


def _capped(view: Capacity, capped: list[tuple[int, int]], *, copied: bool = False) -> Capacity:
    """``view`` with node ``nid`` showing at most ``n`` free GPUs, for each (nid, n)."""
    if not capped:
        return view
    copy = view if copied else view.counts_copy()
    for nid, n in capped:
        if copy.free[nid] > n:
            copy.set_free(nid, n)
    return copy


def is_long(cs: CycleState, limit: float) -> bool:
    """A job of time limit ``limit`` would still run when the backfill shadow starts."""
    return cs.shadow is not None and cs.now + limit > cs.shadow.time


def general_view(cs: CycleState, job: JobRequest, limit: float) -> Capacity:
    """The free GPUs ``job`` may use outside its own reservation."""
    long = is_long(cs, limit)
    book = cs.book
    if not book:
        return book.view(ViewSpec(shadow=True)) if long else cs.cap
    return book.view(book.spec(job, limit, long_backfill=long))


def _place_in(
    cs: CycleState,
    view: Capacity,
    opts: Options,
    *,
    own: str | None = None,
    long: bool = False,
    spread: str | None = None,
) -> Placement | None:
    for gk, shape in opts:
        if spread is not None and len(shape) == 1:
            nodes, leaves = _spread_of(cs, spread)
            counts = choose_spread(view, gk, shape[0], nodes=nodes, leaves=leaves)
        elif len(shape) == 1 and is_share_model(gk[1]):
            counts = choose_share(view, gk, shape[0], _share_mix(cs))
        else:
            counts = choose_nodes(view, gk, shape)
            if counts is not None and len(counts) > 1 and cs.power is not None and cs.power.tight:
                counts = _powered_gang(cs, view, gk, shape, counts)
        if counts is not None:
            return take(cs, counts, own=own, long=long)
    return None


def _powered_gang(
    cs: CycleState, view: Capacity, gk: GroupKey, shape: Shape, counts: NodeCounts
) -> NodeCounts | None:
    """``counts``, or a placement of ``shape`` that leaves each rack its gang as a whole
    would overrun no more free GPUs than its power budget feeds (each node alone fits:
    ``_fitting`` capped it)."""
    power = cs.power
    assert power is not None
    limited: set[str] = set()
    while over := power.over(counts) - limited:
        limited |= over
        view = view.counts_copy()
        for rack in sorted(over):
            left = power.powered_in(rack)
            for nid in power.nodes_of[rack]:
                keep = min(view.free[nid], left)
                view.set_free(nid, keep)
                left -= keep
        got = choose_nodes(view, gk, shape)
        if got is None:
            return None
        counts = got
    return None if power.over(counts) else counts


def _share_mix(cs: CycleState) -> sharing.Fragmentation:
    """The waiting GPU shares' mix (sizes weighted by how many wait), built once a pass."""
    if cs.share_mix is None:
        asks = [
            share_ask(j.gpus) for j in cs.snap.pending if j.gpu_type is not None and wants_share(j.gpu_type)
        ]
        cs.share_mix = sharing.Fragmentation(sharing.mix_of(asks))
    return cs.share_mix


def _spread_of(cs: CycleState, group: str) -> tuple[set[int], set[str]]:
    """The nodes and leaves holding a job of spread group ``group``: running and not
    preempted, or started earlier in this pass."""
    ids = cs.index.id_of
    nodes: set[int] = set()
    for rj in cs.snap.running:
        if rj.job.spread == group and rj.job.id not in cs.preempted:
            nodes.update(ids[p.node] for p in rj.placement if p.node in ids)
    for st in cs.starts:
        if cs.started[st.job_id].spread == group:
            nodes.update(ids[p.node] for p in st.placement if p.node in ids)
    return nodes, {cs.index.nodes[n].leaf for n in nodes}


def take(cs: CycleState, counts: NodeCounts, *, own: str | None = None, long: bool = False) -> Placement:
    """Commit ``counts`` to the pass's capacity: the reservation ``own`` (if any) and
    the backfill shadow's spare GPUs (for a ``long`` job) shrink with it."""
    placement = commit(cs.cap, counts)
    if cs.power is not None:
        cs.power.take(counts)
    if cs.completions:
        cs.changed.extend(nid for nid, _ in counts)
    book = cs.book
    book.used(own, counts)
    shadow = cs.shadow
    if long and shadow is not None:
        spare = shadow.spare
        for nid, c in counts:
            if nid in spare:
                spare[nid] -= c
    if book.views:
        book.sync(nid for nid, _ in counts)
    return placement


def cap_fits(cs: CycleState, opts: Options) -> bool:
    """``opts`` fit in free capacity, reservations and the shadow aside."""
    groups = cs.cap.groups
    return any(groups[gk].fits(shape) for gk, shape in opts)


def reservation_wait(cs: CycleState, job: JobRequest) -> str:
    """Why ``job``, which names a reservation, did not start in it."""
    r = cs.book.by_id.get(job.reservation or "")
    if r is None:
        return f"reservation {job.reservation} does not exist or has ended"
    if not r.active(cs.now):
        return f"reservation {r.id} starts at {r.start:.0f}"
    if not r.owns(job):
        return f"job is not an owner of reservation {r.id}"
    unused = sum(cs.book.unused[r.id].values())
    return f"reservation {r.id} has {unused} unused GPUs, job needs {job.gpus}"
