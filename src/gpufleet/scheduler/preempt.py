"""The preemption step of a pass: which running jobs to stop so that a waiting job fits.

``Preempting`` is the part of ``core._Pass`` that finds victims: running jobs that rank
strictly above the waiting job's floor (``Policy.victim_floor``), worst-ranked first,
released until the job's shape fits in a group, then the ones not needed given back
(fewest victims, best-ranked spared). Most calls need one or two victims and release
them one by one on the capacity; past a few, ``release.py`` works the same answer out on
free counts and the pass applies it at once. Both ways give the same victims and the
same order of nodes inside the free-count buckets (what best fit reads first).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from itertools import accumulate, chain
from typing import TYPE_CHECKING

from gpufleet.scheduler.capacity import Capacity, Flat, FleetIndex, GroupKey, Holdings
from gpufleet.scheduler.model import JobRequest, Placement, Preemption, RunningJob, Snapshot
from gpufleet.scheduler.options import Options
from gpufleet.scheduler.placement import NodeCounts, Shape, choose_nodes
from gpufleet.scheduler.policies import Policy
from gpufleet.scheduler.policies.base import Context, Key
from gpufleet.scheduler.release import (
    Completions,
    Eligible,
    GroupVictims,
    Release,
    release_by_nodes,
    release_plan,
)
from gpufleet.scheduler.reservations import ReservationBook
from gpufleet.scheduler.victims import Ranking, RunningKeys, rank_running


class _GaveUp(enum.Enum):
    TOO_MANY = "too many victims to release one by one"


class Victim:
    __slots__ = ("flat", "gpus", "job", "key", "parts")

    def __init__(
        self, key: Key, job: RunningJob, parts: Holdings, gpus: dict[GroupKey, int], flat: Flat
    ) -> None:
        self.key = key
        self.job = job
        self.parts = parts  # GPUs it holds, per group
        self.gpus = gpus  # how many of them count as capacity, per group
        self.flat = flat  # (node, GPUs that count) per part, all groups


class Preempting:
    """Preemption state and steps of one pass (mixed into ``core._Pass``, which owns
    the attributes declared here)."""

    snap: Snapshot
    policy: Policy
    index: FleetIndex
    cap: Capacity
    book: ReservationBook
    ctx: Context
    running_keys: RunningKeys | None
    preemptions: list[Preemption]

    if TYPE_CHECKING:

        def _take(self, counts: NodeCounts, *, own: str | None = None, long: bool = False) -> Placement: ...

    def init_preemption(self) -> None:
        self.preempted: set[str] = set()  # running jobs this pass decided to preempt
        self.victims: list[Victim] | None = None
        self.victim_totals: dict[GroupKey, list[int]] = {}
        self.victim_front = 0
        self.group_victims: dict[GroupKey, GroupVictims] = {}
        self.completions: dict[tuple[GroupKey, int], Completions] = {}
        self.changed: list[int] = []  # nodes whose free count changed for good (for completions)
        self.worst_key: Key = ()
        self.keyed: Ranking | None = None
        self.hopeless: dict[tuple[object, ...], Key] = {}

    def preempt_for(self, key: Key, job: JobRequest, opts: Options, view: Capacity) -> Placement | None:
        floor = self.policy.victim_floor(key)  # victims must rank strictly above this
        if self.victims is None:
            if self.keyed is None:
                # Cheap first: if no preemptible running job ranks above the floor, none can
                # for any later job either (they come in key order). Rank only if needed.
                self.keyed = self._ranking()
                self.worst_key = self.keyed.worst_key
            if not self.worst_key > floor:
                return None
        victims = self.victims if self.victims is not None else self._rank_victims(floor)
        if not victims or not victims[0].key > floor:
            return None
        scope = self.policy.victim_scope(job)
        for gk, shape in opts:
            memo = (gk, shape, scope)
            if memo in self.hopeless and not key < self.hopeless[memo]:
                continue
            placement = self._preempt_in_group(key, floor, job, gk, shape, view)
            if placement is not None:
                return placement
            self.hopeless[memo] = key
        return None

    def _rank_victims(self, floor: Key) -> list[Victim]:
        """Preemptible running jobs above ``floor``, worst-ranked first, with their GPUs
        per group (``_victim_bound`` sums them up per group when first asked). Floors
        only rise during a pass (jobs come in key order), so jobs at or below this one
        never qualify later."""
        holdings = self.index.holdings_and_flat
        ranked: list[Victim] = []
        assert self.keyed is not None
        for vkey, rj in self.keyed.above(floor):
            ranked.append(Victim(vkey, rj, *holdings(rj)))
        self.victims = ranked
        return ranked

    def _ranking(self) -> Ranking:
        """Running jobs that any waiting job could preempt at all right now, by key."""
        running = self.snap.running
        occ = self.cap.occupancy
        cache = self.running_keys if occ is not None and len(occ.jobs) == len(running) else None
        return rank_running(self.policy, cache, occ, running, self.ctx)

    def _victim_bound(self, key: Key, gk: GroupKey) -> int:
        """GPUs in group ``gk`` held by preemptible jobs ranked below ``key``: an upper
        bound on what preempting all of them can free."""
        victims = self.victims
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
        cum = self.victim_totals.get(gk)
        if cum is None:  # running totals of the victims' GPUs in this group, worst first
            cum = self.victim_totals[gk] = list(accumulate(v.gpus.get(gk, 0) for v in victims))
        return cum[lo - 1]

    def _preempt_in_group(
        self, key: Key, floor: Key, job: JobRequest, gk: GroupKey, shape: Shape, view: Capacity
    ) -> Placement | None:
        """Release the worst-ranked eligible victims until ``shape`` fits in the job's
        view, give back the ones that turn out not to be needed, then place. One by one
        on the capacity when a few victims do (most calls), or where reservation views
        must follow each step (their free_in is not a plain sum); otherwise worked out on
        counts (``_plan_release``) and applied at once. Either way with the same result:
        the same victims, and the same order of nodes inside the free-count buckets
        (what best fit reads first; failed tries change it too)."""
        group = view.groups[gk]
        if group.total + self._victim_bound(floor, gk) < sum(shape):
            return None
        simple = view is self.cap and not self.book.views and 0 < min(shape) <= max(shape) <= group.info.size
        tried = self._preempt_one_by_one(key, floor, job, gk, shape, view, most=8 if simple else None)
        if tried is not _GaveUp.TOO_MANY:
            return tried
        # The bucket moves of the try are overwritten by ``requeue``: it re-appends every
        # node they touched, or leaves it with no free GPU (an order nothing reads).
        got = self._plan_release(key, floor, job, gk, shape)
        self.cap.requeue(gk, got.moved, got.free)
        if not got.fits:
            return None
        counts = choose_nodes(view, gk, shape)
        assert counts is not None
        reason = f"preempted for job {job.id} ({self.policy.name})"
        jobs = self.group_victims[gk].jobs
        for j in got.evict:
            self._evict(jobs[j], job.id, reason)
        return self._take(counts)

    def _plan_release(self, key: Key, floor: Key, job: JobRequest, gk: GroupKey, shape: Shape) -> Release:
        """``release_plan`` over the group's victims that ``job`` may preempt; for k
        equal counts, past a short scan, ``release_by_nodes`` from the nodes that fill
        first (a wide job may need a thousand victims before one node is free)."""
        gv = self._group_victims(gk)
        ids, jobs, keys = gv.ids, gv.jobs, gv.keys
        preempted = self.preempted
        front = gv.front
        while front < len(ids) and ids[front] in preempted:
            front += 1
        gv.front = front
        can, ctx = self.policy.can_preempt, self.ctx

        def candidates() -> Iterator[int]:
            for j in range(front, len(keys)):
                if not keys[j] > floor:
                    return
                if ids[j] not in preempted and can(job, key, jobs[j], keys[j], ctx):
                    yield j

        free, group = self.cap.free, self.cap.groups[gk]
        if shape[-1] == shape[0] > 1 and group.count_ge[shape[0]] < len(shape):
            got = release_plan(free, group.count_ge, shape, gv, candidates(), 64 + group.count_ge[1])
            if got is None:
                who = Eligible(gv, gv.end(floor), preempted, lambda j: can(job, key, jobs[j], keys[j], ctx))
                got = self._release_by_nodes(gk, shape, who)
            if got is not None:
                return got
        got = release_plan(free, group.count_ge, shape, gv, candidates())
        assert got is not None
        return got

    def _release_by_nodes(self, gk: GroupKey, shape: Shape, who: Eligible) -> Release | None:
        """``release_by_nodes`` for k equal counts (most wide jobs). None when nothing
        fits (a scan then works out what the one-by-one releases leave behind)."""
        t = shape[0]
        group = self.cap.groups[gk]
        comp = self.completions.get((gk, t))
        if comp is None:
            comp = self.completions[(gk, t)] = Completions(
                who.gv, t, self.index.groups[gk].nodes, self.cap.free, self.preempted, self.changed
            )
        else:
            comp.refresh(self.changed, self.cap.free, self.preempted)
        found = comp.first(len(shape) - group.count_ge[t], self.cap.free, who)
        if found is None:
            return None
        occupied = chain.from_iterable(group.by_free[1:])
        return release_by_nodes(self.cap.free, group.count_ge[t], shape, found, who, occupied)

    def _group_victims(self, gk: GroupKey) -> GroupVictims:
        gv = self.group_victims.get(gk)
        if gv is None:
            assert self.victims is not None
            nodes = self.index.nodes
            gv = self.group_victims[gk] = GroupVictims(
                (
                    v.key,
                    v.job,
                    v.flat if len(v.parts) == 1 else tuple(p for p in v.flat if nodes[p[0]].group == gk),
                )
                for v in self.victims
                if gk in v.parts and v.job.job.preemptible
            )
        return gv

    def _preempt_one_by_one(
        self,
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
        victims = self.victims
        assert victims is not None
        released: list[tuple[RunningJob, list[tuple[int, tuple[int, ...]]]]] = []
        for i in range(self.victim_front, len(victims)):
            v = victims[i]
            if not v.key > floor:
                break
            if v.job.job.id in self.preempted:
                if i == self.victim_front:
                    self.victim_front += 1  # preempted earlier in this pass: skip for good
                continue
            parts = v.parts.get(gk)
            if not parts or not v.job.job.preemptible:
                continue
            if not self.policy.can_preempt(job, key, v.job, v.key, self.ctx):
                continue
            self._release(parts)
            released.append((v.job, parts))
            if group.fits(shape):
                break
            if len(released) == most:
                for _, parts in released:
                    self._retake(parts)
                return _GaveUp.TOO_MANY
        if not group.fits(shape):
            for _, parts in released:
                self._retake(parts)
            return None
        # Keep the victims that turned out not to be needed (best-ranked first). Spared by
        # position: comparing RunningJob dataclasses field by field is costly.
        spared: set[int] = set()
        for i in range(len(released) - 2, -1, -1):
            parts = released[i][1]
            self._retake(parts)
            if group.fits(shape):
                spared.add(i)
            else:
                self._release(parts)
        counts = choose_nodes(view, gk, shape)
        assert counts is not None
        reason = f"preempted for job {job.id} ({self.policy.name})"
        for i, (rj, _) in enumerate(released):
            if i not in spared:
                self._evict(rj, job.id, reason)
        return self._take(counts)

    def _release(self, parts: list[tuple[int, tuple[int, ...]]]) -> None:
        """Tentatively free a victim's GPUs (counts only; ``_evict`` makes it final)."""
        for nid, gs in parts:
            self.cap.give(nid, self.cap.countable(nid, gs))
        if self.book.views:
            self.book.sync(nid for nid, _ in parts)

    def _retake(self, parts: list[tuple[int, tuple[int, ...]]]) -> None:
        for nid, gs in parts:
            self.cap.set_free(nid, self.cap.free[nid] - self.cap.countable(nid, gs))
        if self.book.views:
            self.book.sync(nid for nid, _ in parts)

    def _evict(self, rj: RunningJob, by: str, reason: str) -> None:
        """Make a released victim's preemption final: its GPU indices are free to pick."""
        for group_parts in self.index.holdings(rj)[0].values():
            for nid, gs in group_parts:
                self.cap.forget(nid, gs)
                if self.completions:
                    self.changed.append(nid)
        self.preempted.add(rj.job.id)
        self.ctx.add_team_gpus(rj.job.team, -rj.job.gpu_weight)
        self.preemptions.append(Preemption(job_id=rj.job.id, by=by, reason=reason))
