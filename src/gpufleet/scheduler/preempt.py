"""The preemption step of a pass: which running jobs to stop so that a waiting job fits.

``preempt_for`` finds victims: running jobs that rank strictly above the waiting job's
floor (``Policy.victim_floor``), worst-ranked first, released until the job's shape fits
in a group, then the ones not needed given back (fewest victims, best-ranked spared).
Most calls need one or two victims and release them one by one on the capacity; past a
few, ``release.py`` works the same answer out on free counts and the pass applies it at
once. Both ways give the same victims and the same order of nodes inside the free-count
buckets (what best fit reads first). Among victims of one rank class the one that loses
least work goes first (``victims.cheapest_first``), and every preemption's reason names
its preemptor and the work lost. ``clear_reserved_gpus`` preempts the other way
round: what runs on GPUs of a reservation whose window starts. Every step reads and
changes the pass's ``CycleState`` (its preemption fields are this module's).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from itertools import accumulate, chain

from gpufleet.scheduler.capacity import Capacity, GroupKey
from gpufleet.scheduler.cycle import CycleState
from gpufleet.scheduler.model import JobRequest, Placement, Preemption, RunningJob
from gpufleet.scheduler.options import Options
from gpufleet.scheduler.placement import Shape, choose_nodes
from gpufleet.scheduler.placing import take
from gpufleet.scheduler.policies.base import Key
from gpufleet.scheduler.release import (
    Completions,
    Eligible,
    GroupVictims,
    Release,
    release_by_nodes,
    release_plan,
)
from gpufleet.scheduler.victims import Ranking, Victim, cheapest_first, lost_work_words, rank_running

__all__ = ["clear_reserved_gpus", "preempt_for"]


class _GaveUp(enum.Enum):
    TOO_MANY = "too many victims to release one by one"


def preempt_for(cs: CycleState, key: Key, job: JobRequest, opts: Options, view: Capacity) -> Placement | None:
    """Place ``job`` (queue key ``key``) in ``view`` by preempting running jobs that rank
    above its floor; None when no set of them makes room."""
    floor = cs.policy.victim_floor(key)  # victims must rank strictly above this
    if cs.victims is None:
        if cs.keyed is None:
            # Cheap first: if no preemptible running job ranks above the floor, none can
            # for any later job either (they come in key order). Rank only if needed.
            cs.keyed = _ranking(cs)
            cs.worst_key = cs.keyed.worst_key
        if not cs.worst_key > floor:
            return None
    victims = cs.victims if cs.victims is not None else _rank_victims(cs, floor)
    if not victims or not victims[0].key > floor:
        return None
    scope = cs.policy.victim_scope(job)
    hopeless = cs.hopeless
    for gk, shape in opts:
        memo = (gk, shape, scope)
        if memo in hopeless and not key < hopeless[memo]:
            continue
        placement = _preempt_in_group(cs, key, floor, job, gk, shape, view)
        if placement is not None:
            return placement
        hopeless[memo] = key
    return None


def _rank_victims(cs: CycleState, floor: Key) -> list[Victim]:
    """Preemptible running jobs above ``floor``, worst-ranked first, with their GPUs
    per group (``_victim_bound`` sums them up per group when first asked). Floors
    only rise during a pass (jobs come in key order), so jobs at or below this one
    never qualify later."""
    holdings = cs.index.holdings_and_flat
    ranked: list[Victim] = []
    assert cs.keyed is not None
    for vkey, rj in cs.keyed.above(floor):
        ranked.append(Victim(vkey, rj, *holdings(rj)))
    ranked = cs.victims = cheapest_first(ranked, cs.policy.victim_class, cs.now)
    return ranked


def _ranking(cs: CycleState) -> Ranking:
    """Running jobs that any waiting job could preempt at all right now, by key."""
    running = cs.snap.running
    occ = cs.cap.occupancy
    cache = cs.running_keys if occ is not None and len(occ.jobs) == len(running) else None
    return rank_running(cs.policy, cache, occ, running, cs.ctx)


def _victim_bound(cs: CycleState, key: Key, gk: GroupKey) -> int:
    """GPUs in group ``gk`` held by preemptible jobs ranked below ``key``: an upper
    bound on what preempting all of them can free."""
    victims = cs.victims
    assert victims is not None
    lo, hi = 0, len(victims)
    while lo < hi:  # keys are non-increasing: find the first one not above `key`
        mid = (lo + hi) // 2
        if victims[mid].key > key:
            lo = mid + 1
        else:
            hi = mid
    if not lo:
        return 0
    cum = cs.victim_totals.get(gk)
    if cum is None:  # running totals of the victims' GPUs in this group, worst first
        cum = cs.victim_totals[gk] = list(accumulate(v.gpus.get(gk, 0) for v in victims))
    return cum[lo - 1]


def _preempt_in_group(
    cs: CycleState, key: Key, floor: Key, job: JobRequest, gk: GroupKey, shape: Shape, view: Capacity
) -> Placement | None:
    """Release the worst-ranked eligible victims until ``shape`` fits in the job's
    view, give back the ones that turn out not to be needed, then place. One by one
    on the capacity when a few victims do (most calls), or where reservation views
    must follow each step (their free_in is not a plain sum); otherwise worked out on
    counts (``_plan_release``) and applied at once. Either way with the same result:
    the same victims, and the same order of nodes inside the free-count buckets
    (what best fit reads first; failed tries change it too)."""
    group = view.groups[gk]
    if group.total + _victim_bound(cs, floor, gk) < sum(shape):
        return None
    simple = view is cs.cap and not cs.book.views and 0 < min(shape) <= max(shape) <= group.info.size
    if cs.power is not None:  # one by one, so that power.allows can refuse before any eviction
        simple = False
    tried = _preempt_one_by_one(cs, key, floor, job, gk, shape, view, most=8 if simple else None)
    if tried is not _GaveUp.TOO_MANY:
        return tried
    # The bucket moves of the try are overwritten by ``requeue``: it re-appends every
    # node they touched, or leaves it with no free GPU (an order nothing reads).
    got = _plan_release(cs, key, floor, job, gk, shape)
    cs.cap.requeue(gk, got.moved, got.free)
    if not got.fits:
        return None
    counts = choose_nodes(view, gk, shape)
    assert counts is not None
    jobs = cs.group_victims[gk].jobs
    for j in got.evict:
        _evict(cs, jobs[j], job.id, _reason(cs, job, jobs[j]))
    return take(cs, counts)


def _plan_release(
    cs: CycleState, key: Key, floor: Key, job: JobRequest, gk: GroupKey, shape: Shape
) -> Release:
    """``release_plan`` over the group's victims that ``job`` may preempt; for k
    equal counts, past a short scan, ``release_by_nodes`` from the nodes that fill
    first (a wide job may need a thousand victims before one node is free)."""
    gv = _group_victims(cs, gk)
    ids, jobs, keys = gv.ids, gv.jobs, gv.keys
    preempted = cs.preempted
    front = gv.front
    while front < len(ids) and ids[front] in preempted:
        front += 1
    gv.front = front
    can, ctx = cs.policy.can_preempt, cs.ctx

    def candidates() -> Iterator[int]:
        for j in range(front, len(keys)):
            if not keys[j] > floor:
                return
            if ids[j] not in preempted and can(job, key, jobs[j], keys[j], ctx):
                yield j

    free, group = cs.cap.free, cs.cap.groups[gk]
    if shape[-1] == shape[0] > 1 and group.count_ge[shape[0]] < len(shape):
        got = release_plan(free, group.count_ge, shape, gv, candidates(), 64 + group.count_ge[1])
        if got is None:
            who = Eligible(gv, gv.end(floor), preempted, lambda j: can(job, key, jobs[j], keys[j], ctx))
            got = _release_by_nodes(cs, gk, shape, who)
        if got is not None:
            return got
    got = release_plan(free, group.count_ge, shape, gv, candidates())
    assert got is not None
    return got


def _release_by_nodes(cs: CycleState, gk: GroupKey, shape: Shape, who: Eligible) -> Release | None:
    """``release_by_nodes`` for k equal counts (most wide jobs). None when nothing
    fits (a scan then works out what the one-by-one releases leave behind)."""
    t = shape[0]
    cap = cs.cap
    group = cap.groups[gk]
    comp = cs.completions.get((gk, t))
    if comp is None:
        comp = cs.completions[(gk, t)] = Completions(
            who.gv, t, cs.index.groups[gk].nodes, cap.free, cs.preempted, cs.changed
        )
    else:
        comp.refresh(cs.changed, cap.free, cs.preempted)
    found = comp.first(len(shape) - group.count_ge[t], cap.free, who)
    if found is None:
        return None
    occupied = chain.from_iterable(group.by_free[1:])
    return release_by_nodes(cap.free, group.count_ge[t], shape, found, who, occupied)


def _group_victims(cs: CycleState, gk: GroupKey) -> GroupVictims:
    gv = cs.group_victims.get(gk)
    if gv is None:
        victims = cs.victims
        assert victims is not None
        nodes = cs.index.nodes
        gv = cs.group_victims[gk] = GroupVictims(
            (
                v.key,
                v.job,
                v.flat if len(v.parts) == 1 else tuple(p for p in v.flat if nodes[p[0]].group == gk),
            )
            for v in victims
            if gk in v.parts and v.job.job.preemptible
        )
    return gv


def _preempt_one_by_one(
    cs: CycleState,
    key: Key,
    floor: Key,
    job: JobRequest,
    gk: GroupKey,
    shape: Shape,
    view: Capacity,
    most: int | None = None,
) -> Placement | _GaveUp | None:
    """``_preempt_in_group`` by releasing and retaking victims on the capacity
    itself, keeping the reservation views in step after each. Past ``most``
    releases without a fit it retakes them as on failure and gives up."""
    group = view.groups[gk]
    victims = cs.victims
    assert victims is not None
    preempted = cs.preempted
    can, ctx = cs.policy.can_preempt, cs.ctx
    released: list[tuple[RunningJob, list[tuple[int, tuple[int, ...]]]]] = []
    for i in range(cs.victim_front, len(victims)):
        v = victims[i]
        if not v.key > floor:
            break
        if v.job.job.id in preempted:
            if i == cs.victim_front:
                cs.victim_front += 1  # preempted earlier in this pass: skip for good
            continue
        parts = v.parts.get(gk)
        if not parts or not v.job.job.preemptible:
            continue
        if not can(job, key, v.job, v.key, ctx):
            continue
        _release(cs, parts)
        released.append((v.job, parts))
        if group.fits(shape):
            break
        if len(released) == most:
            for _, parts in released:
                _retake(cs, parts)
            return _GaveUp.TOO_MANY
    if not group.fits(shape):
        for _, parts in released:
            _retake(cs, parts)
        return None
    # Keep the victims that turned out not to be needed (best-ranked first). Spared by
    # position: comparing RunningJob dataclasses field by field is costly.
    spared: set[int] = set()
    for i in range(len(released) - 2, -1, -1):
        parts = released[i][1]
        _retake(cs, parts)
        if group.fits(shape):
            spared.add(i)
        else:
            _release(cs, parts)
    counts = choose_nodes(view, gk, shape)
    assert counts is not None
    if cs.power is not None and not cs.power.allows(
        cs.index, counts, (rj for i, (rj, _) in enumerate(released) if i not in spared)
    ):
        for i, (_, parts) in enumerate(released):
            if i not in spared:
                _retake(cs, parts)
        return None  # the start would overrun a rack's power budget
    for i, (rj, _) in enumerate(released):
        if i not in spared:
            _evict(cs, rj, job.id, _reason(cs, job, rj))
    return take(cs, counts)


def _reason(cs: CycleState, job: JobRequest, victim: RunningJob) -> str:
    """A preemption's reason: the preemptor, the policy, why it ranks first (the policy's
    words: for ``default`` both sides' predicted or attained figures) and the work the
    victim loses."""
    why = cs.policy.preempt_words(job, victim, cs.now)
    words = f"; {why}" if why else ""
    return f"preempted for job {job.id} ({cs.policy.name}{words}); {lost_work_words(victim, cs.now)}"


def _release(cs: CycleState, parts: list[tuple[int, tuple[int, ...]]]) -> None:
    """Tentatively free a victim's GPUs (counts only; ``_evict`` makes it final)."""
    cap = cs.cap
    for nid, gs in parts:
        cap.give(nid, cap.countable(nid, gs))
    if cs.book.views:
        cs.book.sync(nid for nid, _ in parts)


def _retake(cs: CycleState, parts: list[tuple[int, tuple[int, ...]]]) -> None:
    cap = cs.cap
    for nid, gs in parts:
        cap.set_free(nid, cap.free[nid] - cap.countable(nid, gs))
    if cs.book.views:
        cs.book.sync(nid for nid, _ in parts)


def _evict(cs: CycleState, rj: RunningJob, by: str, reason: str) -> None:
    """Make a released victim's preemption final: its GPU indices are free to pick."""
    for group_parts in cs.index.holdings(rj)[0].values():
        for nid, gs in group_parts:
            cs.cap.forget(nid, gs)
            if cs.completions:
                cs.changed.append(nid)
    cs.preempted.add(rj.job.id)
    cs.ctx.add_team_gpus(rj.job.team, -rj.job.gpu_weight)
    if cs.power is not None:
        cs.power.release(cs.index, rj, cs.cap.free)
    cs.preemptions.append(Preemption(job_id=rj.job.id, by=by, reason=reason))


def clear_reserved_gpus(cs: CycleState) -> None:
    """At window start: preempt preemptible non-owner jobs on reserved GPUs; move
    what non-preemptible ones hold to free GPUs (see reservations.py)."""
    for r, rj in cs.book.window_conflicts(cs.snap.running):
        if not rj.job.preemptible or rj.job.id in cs.preempted:
            continue
        for group_parts in cs.index.holdings(rj)[0].values():
            _release(cs, group_parts)
        _evict(cs, rj, r.id, f"reservation {r.id} starts on its GPUs")
    cs.book.move_shortfalls()
