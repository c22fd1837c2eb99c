"""``plan(snapshot, policy) -> Plan``: the one scheduling pass that the server and the
simulator both call.

Pipeline (each step a small method of ``_Pass``)::

    snapshot --split: held teams' jobs, blocked jobs (deps.py), 0-GPU jobs, GPU jobs-->
    --index--> capacity --reservations starting: preempt/move--> --order-->
    for each waiting GPU job:
        options (group, shape)   Unschedulable reasons are data, not exceptions
        quota filter             team hard limits
        array limit              at most array_limit tasks of one array at once
        place                    own reservation first, then the job's view of free GPUs
                                 (reservations.py), topology-aware best fit (placement.py)
        | backfill guard         EASY: do not delay the reserved head job
        | preempt                lower-key victims, fewest needed (preempt.py, release.py)
    --> 0-GPU jobs in queue order: the least-loaded node of their pool (cpu.py)
    --> explain: queue positions, estimated starts (estimate.py), reasons, fragmentation;
        then 0-GPU jobs that found no node, then held jobs (no position, no estimate),
        then blocked jobs (no position; estimated start: their predecessors' latest end)

Pure: no clock, no I/O, no randomness, no state kept between calls (what a caller
wants reused lives in its ``PlanCache``); ties are broken by the snapshot's own order,
so the same snapshot gives the same plan, with or without a cache.
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from operator import attrgetter

from gpufleet.migindex import is_share_model, wants_share
from gpufleet.scheduler import sharing
from gpufleet.scheduler.cache import PlanCache
from gpufleet.scheduler.capacity import Capacity, FleetIndex
from gpufleet.scheduler.cpu import CpuPlacer
from gpufleet.scheduler.estimate import Estimator, release_events
from gpufleet.scheduler.features import NodeFilter, node_filters
from gpufleet.scheduler.licenses import LicenseUsage
from gpufleet.scheduler.model import (
    JobRequest,
    PendingStatus,
    Placement,
    Plan,
    Preemption,
    Snapshot,
    Start,
    Status,
)
from gpufleet.scheduler.options import Options, gpu_type_matches, job_options, shared_options
from gpufleet.scheduler.placement import (
    NodeCounts,
    choose_nodes,
    choose_share,
    choose_spread,
    commit,
    describe_shape,
    share_ask,
)
from gpufleet.scheduler.policies import Policy, make_policy
from gpufleet.scheduler.policies.base import Context, Key
from gpufleet.scheduler.preempt import Preempting
from gpufleet.scheduler.qos import QosUsage
from gpufleet.scheduler.reservations import ReservationBook, ViewSpec
from gpufleet.scheduler.resources import NodeResources
from gpufleet.scheduler.victims import RunningKeys, caches_running_keys

__all__ = ["Options", "PlanCache", "gc_paused", "gpu_type_matches", "job_options", "plan", "shared_options"]

_gpus_of = attrgetter("gpus")


def plan(
    snapshot: Snapshot,
    policy: Policy | str,
    *,
    explain: bool = True,
    cache: PlanCache | None = None,
    pause_gc: bool = False,
) -> Plan:
    """Decide what starts now (GPU and 0-GPU jobs), what is preempted and, with
    ``explain``, where every waiting job stands (position, estimated start, reason). The
    simulator passes ``explain=False`` because it needs only the decisions.

    ``cache``: the caller's ``PlanCache``, reused from pass to pass (one per loop or
    thread); None rebuilds everything for this pass. The plan is the same either way.

    ``pause_gc``: hold the process's cyclic garbage collector off during the pass (see
    ``gc_paused``). The caller's choice, since the switch is process-wide: a scheduling
    loop in its own thread or process wants it for big queues."""
    if isinstance(policy, str):
        policy = make_policy(policy)
    if not pause_gc:
        return _Pass(snapshot, policy, explain, cache).run()
    with gc_paused():
        return _Pass(snapshot, policy, explain, cache).run()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Hold the cyclic garbage collector off for one pass. A pass over 10,000 waiting
    jobs allocates ~100,000 short-lived tuples; collections in the middle of it find
    them alive, promote them, and soon trigger full collections over the caller's whole
    heap. Measured (bench_scheduler.py's fleet: 1,000 nodes, explain=True; median process
    time, best of two runs): over 50,000 waiting jobs, passes with the collector on took
    1188 ms against 942 paused (default), 1050 vs 742 (las), 589 vs 455 (fifo), 871 vs
    690 (fairshare), 507 vs 469 (backfill); over 10,000 no difference beyond noise; a
    simulator replay (short queues) gained nothing, so the simulator leaves it alone.
    The pass makes no reference cycles of its own, so nothing waits longer to be freed.
    It only touches the process-wide switch when the collector is on, and turns it back
    on exactly once."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass(slots=True)
class _Wait:
    status: Status
    code: str
    detail: str = ""
    options: Options | None = None


@dataclass(slots=True)
class _Shadow:
    """EASY backfill's reservation for the first blocked job. ``spare``: node -> GPUs
    free at ``time`` that the reserved job leaves over (what a long job may use now)."""

    job_id: str
    time: float
    spare: dict[int, int]


class _Pass(Preempting):
    def __init__(self, snapshot: Snapshot, policy: Policy, explain: bool, cache: PlanCache | None) -> None:
        self.snap = snapshot
        self.policy = policy
        self.explain = explain
        self.now = snapshot.now
        self.split_pending()
        self.index: FleetIndex = FleetIndex(snapshot.fleet) if cache is None else cache.index(snapshot.fleet)
        self.cap = Capacity.build(self.index, snapshot.running)
        self.running_keys: RunningKeys | None = None
        if policy.preemptive and caches_running_keys(policy) and self.cap.occupancy is not None:
            self.running_keys = self.index.policy_state(policy, RunningKeys)
            self.running_keys.observe(self.cap.occupancy)
        self.book = ReservationBook(self.cap, snapshot.reservations, snapshot.running, self.now)
        self.ctx = Context.of(snapshot, None if cache is None else cache.policy_memo(policy))
        self.starts: list[Start] = []
        self.started: dict[str, JobRequest] = {}
        self.preemptions: list[Preemption] = []
        self.waits: dict[str, _Wait] = {}
        self.options_cache: dict[tuple[object, ...], Options | str] = {}
        self.shadow: _Shadow | None = None
        self.strict_blocker: str | None = None
        self.init_preemption()
        self.nofit: dict[tuple[int, bool, int, int, str | None, frozenset[str]], _Wait] = {}
        self.reasons: dict[int, str] = {}  # id(options) -> "Resources: ..." (explain only)
        self.array_counts: dict[str, int] | None = None  # tasks running per array (built on use)
        self.res = NodeResources.build(snapshot.fleet, snapshot.running, snapshot.pending)
        self.qos = QosUsage(snapshot.qos, snapshot.running)
        self.licenses = LicenseUsage(snapshot.licenses, snapshot.running)
        self.pool_nodes: dict[str, list[str]] = {}
        self.masked = False  # the last placement hid nodes lacking CPUs or memory
        self._share_mix: sharing.Fragmentation | None = None

    def split_pending(self) -> None:
        """Held teams' jobs, 0-GPU jobs and GPU jobs (most passes have only the last:
        the checks run at C speed and copy nothing then)."""
        pending: Sequence[JobRequest] = self.snap.pending
        self.held: list[tuple[JobRequest, str]] = []
        self.blocked: list[JobRequest] = []
        self.cpu_pending: list[JobRequest] = []
        self.gpu_pending: Sequence[JobRequest] = pending
        if any(j.blocked is not None for j in pending):
            self.blocked = [j for j in pending if j.blocked is not None]
            pending = [j for j in pending if j.blocked is None]
        holds = {h.team: h.reason for h in self.snap.holds}
        if holds:
            self.held = [(j, holds[j.team]) for j in pending if j.team in holds]
            if self.held:
                pending = [j for j in pending if j.team not in holds]
        if 0 in map(_gpus_of, pending):
            self.cpu_pending = [j for j in pending if j.gpus == 0]
            pending = [j for j in pending if j.gpus != 0]
        self.gpu_pending = pending

    # -- the pass -------------------------------------------------------------------
    def run(self) -> Plan:
        if self.book:
            self.clear_reserved_gpus()
        if not self.explain and not self.policy.preemptive and self.cap.total_free == 0:
            ordered = []  # nothing can start: skip ordering the queue
        else:
            ordered = self.policy.order(self.gpu_pending, self.ctx)
        for key, job in ordered:
            if (
                not self.explain
                and not self.policy.preemptive
                and (self.strict_blocker is not None or self.cap.total_free == 0)
            ):
                break
            self.consider(key, job)
        cpu_starts, unplaced = self.start_cpu_jobs() if self.cpu_pending else ([], [])
        if self.explain:
            queued = self.explain_waits(ordered)
            pending = queued + self.outside_queue(unplaced, queued)
        else:
            pending = ()
        return Plan(
            policy=self.policy.name,
            starts=(*self.starts, *cpu_starts),
            preemptions=tuple(self.preemptions),
            reservation_moves=tuple(self.book.moves),
            pending=pending,
            fragmentation=self.fragmentation(ordered),
            free_gpus=self.cap.total_free,
        )

    def consider(self, key: Key, job: JobRequest) -> None:
        opts = self.options(job)
        if isinstance(opts, str):
            self.waits[job.id] = _Wait(Status.UNRESOLVABLE, "Unschedulable", opts)
            return
        quota = self.ctx.quotas.get(job.team)
        if quota is not None and quota.limit is not None:
            held = self.ctx.team_gpus.get(job.team, 0)
            if held + job.gpu_weight > quota.limit:
                self.waits[job.id] = _Wait(
                    Status.UNSCHEDULABLE,
                    "QuotaLimit",
                    f"team {job.team} holds {held:g} of its {quota.limit}-GPU limit, "
                    f"job needs {job.gpu_weight:g}",
                    opts,
                )
                return
        if job.array_limit > 0 and (full := self.array_full(job)) is not None:
            self.waits[job.id] = _Wait(Status.UNSCHEDULABLE, "JobArrayTaskLimit", full, opts)
            return
        if self.qos.limits and (over := self.qos.blocked(job)) is not None:
            self.waits[job.id] = _Wait(Status.UNSCHEDULABLE, over[0], over[1], opts)
            return
        if job.licenses and (short := self.licenses.blocked(job)) is not None:
            self.waits[job.id] = _Wait(Status.UNSCHEDULABLE, "Licenses", short, opts)
            return
        asks = self.res is not None and (job.cpus > 0 or job.mem_mb > 0)
        if asks and (never := self.never_fits(job)) is not None:
            self.waits[job.id] = _Wait(Status.UNRESOLVABLE, "Unschedulable", never)
            return
        if self.strict_blocker is not None:
            self.waits[job.id] = _Wait(
                Status.UNSCHEDULABLE, "Priority", f"strict order: behind job {self.strict_blocker}", opts
            )
            return
        limit = self.policy.limit(job)
        # Without preemption or reservations free capacity only shrinks during a pass, so a
        # job shaped like one that did not fit will not fit either: skip the search.
        same = None
        if not self.policy.preemptive and not self.book and job.reservation is None:
            same = (id(opts), self._is_long(limit), job.cpus, job.mem_mb, job.constraint, job.exclude)
            hit = self.nofit.get(same)
            if hit is not None:
                self.waits[job.id] = hit
                return
        self.masked = False
        placement = self.place(job, opts, limit)
        if placement is None and job.reservation is not None:
            self.waits[job.id] = _Wait(Status.UNSCHEDULABLE, "Reservation", self.reservation_wait(job), opts)
            return
        filtered = job.constraint is not None or bool(job.exclude)  # victims are chosen on any node
        if placement is None and self.policy.preemptive and not asks and not filtered:  # nor for CPUs
            placement = self.preempt_for(key, job, opts, self.general_view(job, limit))
        if placement is not None:
            self.record_start(job, placement)
            return
        if self.shadow is not None and self.cap_fits(opts):
            wait = _Wait(
                Status.UNSCHEDULABLE,
                "Priority",
                f"would delay job {self.shadow.job_id}, reserved to start first",
                opts,
            )
        elif self.masked and self.res is not None:
            needs = self.res.describe(job)
            wait = _Wait(
                Status.UNSCHEDULABLE, "Resources", f"needs {needs} per node, free on no node that fits", opts
            )
        else:
            wait = _Wait(Status.UNSCHEDULABLE, "Resources", options=opts)
        self.waits[job.id] = wait
        if same is not None and (wait.code == "Resources" or not self.explain):
            self.nofit[same] = wait  # a "Priority" reason could turn into "Resources" later
        if wait.code != "Resources":
            return
        if self.policy.backfill == "none":
            self.strict_blocker = job.id
        elif self.policy.backfill == "easy" and self.shadow is None:
            self.reserve(job, opts)

    def start_cpu_jobs(self) -> tuple[list[Start], list[tuple[JobRequest, str]]]:
        """0-GPU jobs, in the policy's order, after the GPU jobs (whose starts and
        preemptions count on their nodes): their starts, and the jobs that found no
        node, with why. Kept apart from ``starts``: they hold no GPU to estimate with."""
        placer = CpuPlacer(
            self.snap.fleet,
            self.snap.running,
            preempted=self.preempted,
            starts=self.starts,
            resources=self.res,
        )
        starts: list[Start] = []
        unplaced: list[tuple[JobRequest, str]] = []
        for _, job in self.policy.order(self.cpu_pending, self.ctx):
            if job.array_limit > 0 and (full := self.array_full(job)) is not None:
                unplaced.append((job, f"JobArrayTaskLimit: {full}"))
                continue
            if self.qos.limits and (over := self.qos.blocked(job)) is not None:
                unplaced.append((job, f"{over[0]}: {over[1]}"))
                continue
            if job.licenses and (short := self.licenses.blocked(job)) is not None:
                unplaced.append((job, f"Licenses: {short}"))
                continue
            if (
                self.res is not None
                and (job.cpus or job.mem_mb)
                and (never := self.never_fits(job)) is not None
            ):
                unplaced.append((job, f"Unschedulable: {never}"))
                continue
            got = placer.place(job)
            if isinstance(got, str):
                unplaced.append((job, got))
            else:
                starts.append(got)
                self.qos.take(job)
                self.licenses.take(job)
                if job.array is not None:
                    self._count_array(job.array)
        return starts, unplaced

    def array_full(self, job: JobRequest) -> str | None:
        """Why another task of ``job``'s array may not start now (None: it may)."""
        if self.array_counts is None:
            self.array_counts = {}
            for rj in self.snap.running:
                if rj.job.array is not None and rj.job.id not in self.preempted:
                    self._count_array(rj.job.array)
        n = self.array_counts.get(job.array or "", 0)
        if n < job.array_limit:
            return None
        return f"array {job.array} runs {n} tasks, its limit is {job.array_limit}"

    def _count_array(self, array: str) -> None:
        if self.array_counts is not None:
            self.array_counts[array] = self.array_counts.get(array, 0) + 1

    def outside_queue(
        self, unplaced: list[tuple[JobRequest, str]], queued: tuple[PendingStatus, ...] = ()
    ) -> tuple[PendingStatus, ...]:
        """0-GPU jobs that found no node, then held jobs: no position, no estimate; then
        blocked jobs: no position, an estimate from their predecessors' (``queued``: the
        queue's statuses, for the estimated starts of waiting predecessors)."""
        out = [
            PendingStatus(
                job_id=job.id, position=None, estimated_start=None, status=Status.UNSCHEDULABLE, reason=why
            )
            for job, why in (*unplaced, *self.held)
        ]
        if self.blocked:
            etas = self.blocked_etas(queued)
            for job in self.blocked:
                b = job.blocked
                assert b is not None
                out.append(
                    PendingStatus(
                        job_id=job.id,
                        position=None,
                        estimated_start=etas.get(job.id),
                        status=Status.UNRESOLVABLE if b.never else Status.UNSCHEDULABLE,
                        reason=f"{b.code}: {b.detail}" if b.detail else b.code,
                    )
                )
        return tuple(out)

    def blocked_etas(self, queued: tuple[PendingStatus, ...]) -> dict[str, float]:
        """A blocked job's estimated start: the latest estimated end of the jobs it waits
        for (running: started + limit; started this pass: now + limit; waiting: its
        estimated start + limit; blocked: its own estimate + limit), never before now.
        Unknown for any of them: no estimate."""
        limit = self.policy.limit
        ends: dict[str, float] = {}
        for rj in self.snap.running:
            if rj.job.id not in self.preempted:
                ends[rj.job.id] = max(self.now, rj.started_at + limit(rj.job))
        for job in self.started.values():
            ends[job.id] = self.now + limit(job)
        jobs = {j.id: j for j in self.snap.pending}
        for st in queued:
            if st.estimated_start is not None and st.job_id in jobs:
                ends[st.job_id] = st.estimated_start + limit(jobs[st.job_id])
        etas: dict[str, float] = {}
        blocked = {j.id: j for j in self.blocked}
        visiting: set[str] = set()

        def eta(job: JobRequest) -> float | None:
            if job.id in etas:
                return etas[job.id]
            b = job.blocked
            if b is None or b.never or job.id in visiting:
                return None
            if not b.after:
                if b.not_before is None:
                    return None
                etas[job.id] = max(self.now, b.not_before)
                return etas[job.id]
            visiting.add(job.id)
            latest = max(self.now, b.not_before or self.now)
            for pid in b.after:
                end = ends.get(pid)
                if end is None and pid in blocked:
                    start = eta(blocked[pid])
                    end = None if start is None else start + limit(blocked[pid])
                if end is None:
                    visiting.discard(job.id)
                    return None
                latest = max(latest, end)
            visiting.discard(job.id)
            etas[job.id] = latest
            return latest

        for job in self.blocked:
            eta(job)
        return etas

    def record_start(self, job: JobRequest, placement: Placement) -> None:
        self.starts.append(Start(job_id=job.id, placement=placement))
        self.started[job.id] = job
        self.ctx.add_team_gpus(job.team, job.gpu_weight)
        self.qos.take(job)
        self.licenses.take(job)
        if job.array is not None:
            self._count_array(job.array)
        if self.res is not None and (job.cpus or job.mem_mb):
            self.res.take((p.node for p in placement), job)

    def never_fits(self, job: JobRequest) -> str | None:
        """Why ``job``'s CPUs or memory fit on no node of its pool, ever (None: they may)."""
        assert self.res is not None
        nodes = self.pool_nodes.get(job.pool)
        if nodes is None:
            nodes = self.pool_nodes[job.pool] = [n.name for n in self.snap.fleet.nodes if n.pool == job.pool]
        return self.res.never(job, nodes)

    # -- options: where a job could ever run ------------------------------------------
    def options(self, job: JobRequest) -> Options | str:
        ck = (job.gpus, job.gpus_per_node, job.nodes, job.gpu_type, job.pool)
        hit = self.options_cache.get(ck)
        if hit is None:
            hit = self.options_cache[ck] = shared_options(self.index, job)
        return hit

    # -- placement ------------------------------------------------------------------
    def place(self, job: JobRequest, opts: Options, limit: float) -> Placement | None:
        """Inside the job's own active reservation first, then (unless it named one) in
        its general view: free GPUs less those reserved for others, and for EASY
        backfill's long jobs, less what the reserved head job needs."""
        tries: list[NodeFilter | None] = [*node_filters(job)] or [None]
        for only in tries:  # a [a|b] constraint: each alternative in turn
            placement = self._place_filtered(job, opts, limit, only)
            if placement is not None:
                return placement
        return None

    def _place_filtered(
        self, job: JobRequest, opts: Options, limit: float, only: NodeFilter | None
    ) -> Placement | None:
        own = self.book.owned_active(job) if self.book else None
        spread = job.spread
        if own is not None:
            view = self._fitting(self.book.view(ViewSpec(own=own.id)), opts, job, only)
            placement = self._place_in(view, opts, own=own.id, spread=spread)
            if placement is not None or job.reservation is not None:
                return placement
        elif job.reservation is not None:
            return None
        view = self._fitting(self.general_view(job, limit), opts, job, only)
        return self._place_in(view, opts, long=self._is_long(limit), spread=spread)

    def _fitting(self, view: Capacity, opts: Options, job: JobRequest, only: NodeFilter | None) -> Capacity:
        """``view`` without the free GPUs of nodes where ``job``'s CPUs or memory do not
        fit now, or that its ``--constraint``/``--exclude`` rule out (``only``; a copy,
        only when there are such nodes)."""
        sized = self.res is not None and bool(job.cpus or job.mem_mb)
        if not sized and only is None:
            return view
        nodes = self.index.nodes
        res = self.res
        lacking = [
            nid
            for gk, _ in opts
            for nid in self.index.groups[gk].nodes
            if view.free[nid]
            and (
                (only is not None and not only(self.index.fleet.nodes[nid]))
                or (sized and res is not None and not res.fits(nodes[nid].name, job))
            )
        ]
        if not lacking:
            return view
        self.masked = True
        copy = view.counts_copy()
        for nid in lacking:
            copy.set_free(nid, 0)
        return copy

    def _is_long(self, limit: float) -> bool:
        return self.shadow is not None and self.now + limit > self.shadow.time

    def general_view(self, job: JobRequest, limit: float) -> Capacity:
        long = self._is_long(limit)
        if not self.book:
            return self.book.view(ViewSpec(shadow=True)) if long else self.cap
        return self.book.view(self.book.spec(job, limit, long_backfill=long))

    def _place_in(
        self,
        view: Capacity,
        opts: Options,
        *,
        own: str | None = None,
        long: bool = False,
        spread: str | None = None,
    ) -> Placement | None:
        for gk, shape in opts:
            if spread is not None and len(shape) == 1:
                nodes, leaves = self.spread_of(spread)
                counts = choose_spread(view, gk, shape[0], nodes=nodes, leaves=leaves)
            elif len(shape) == 1 and is_share_model(gk[1]):
                counts = choose_share(view, gk, shape[0], self.share_mix())
            else:
                counts = choose_nodes(view, gk, shape)
            if counts is not None:
                return self._take(counts, own=own, long=long)
        return None

    def share_mix(self) -> sharing.Fragmentation:
        """The waiting GPU shares' mix (sizes weighted by how many wait), built once a pass."""
        if self._share_mix is None:
            asks = [
                share_ask(j.gpus)
                for j in self.snap.pending
                if j.gpu_type is not None and wants_share(j.gpu_type)
            ]
            self._share_mix = sharing.Fragmentation(sharing.mix_of(asks))
        return self._share_mix

    def spread_of(self, group: str) -> tuple[set[int], set[str]]:
        """The nodes and leaves holding a job of spread group ``group``: running and not
        preempted, or started earlier in this pass."""
        ids = self.index.id_of
        nodes: set[int] = set()
        for rj in self.snap.running:
            if rj.job.spread == group and rj.job.id not in self.preempted:
                nodes.update(ids[p.node] for p in rj.placement if p.node in ids)
        for st in self.starts:
            if self.started[st.job_id].spread == group:
                nodes.update(ids[p.node] for p in st.placement if p.node in ids)
        return nodes, {self.index.nodes[n].leaf for n in nodes}

    def _take(self, counts: NodeCounts, *, own: str | None = None, long: bool = False) -> Placement:
        placement = commit(self.cap, counts)
        if self.completions:
            self.changed.extend(nid for nid, _ in counts)
        self.book.used(own, counts)
        if long and self.shadow is not None:
            spare = self.shadow.spare
            for nid, c in counts:
                if nid in spare:
                    spare[nid] -= c
        if self.book.views:
            self.book.sync(nid for nid, _ in counts)
        return placement

    def reservation_wait(self, job: JobRequest) -> str:
        r = self.book.by_id.get(job.reservation or "")
        if r is None:
            return f"reservation {job.reservation} does not exist or has ended"
        if not r.active(self.now):
            return f"reservation {r.id} starts at {r.start:.0f}"
        if not r.owns(job):
            return f"job is not an owner of reservation {r.id}"
        unused = sum(self.book.unused[r.id].values())
        return f"reservation {r.id} has {unused} unused GPUs, job needs {job.gpus}"

    # -- reservations starting ------------------------------------------------------------
    def clear_reserved_gpus(self) -> None:
        """At window start: preempt preemptible non-owner jobs on reserved GPUs; move
        what non-preemptible ones hold to free GPUs (see reservations.py)."""
        for r, rj in self.book.window_conflicts(self.snap.running):
            if not rj.job.preemptible or rj.job.id in self.preempted:
                continue
            for group_parts in self.index.holdings(rj)[0].values():
                self._release(group_parts)
            self._evict(rj, r.id, f"reservation {r.id} starts on its GPUs")
        self.book.move_shortfalls()

    def cap_fits(self, opts: Options) -> bool:
        return any(self.cap.groups[gk].fits(shape) for gk, shape in opts)

    # -- EASY backfill ----------------------------------------------------------------
    def reserve(self, job: JobRequest, opts: Options) -> None:
        est = self.estimator()
        booked = est.earliest(opts)
        if booked is None:
            return
        gk, shape = booked
        counts = choose_nodes(est.cap, gk, shape)
        assert counts is not None
        at_shadow = est.cap.free
        spare = {nid: at_shadow[nid] for nid in self.index.groups[gk].nodes}
        for nid, c in counts:
            spare[nid] -= c
        self.shadow = _Shadow(job_id=job.id, time=est.t, spare=spare)
        self.book.set_spare(spare)

    def estimator(self) -> Estimator:
        running = [rj for rj in self.snap.running if rj.job.id not in self.preempted]
        events = release_events(self.cap, running, self.started.values(), self.starts, self.policy, self.now)
        est = Estimator(self.cap.counts_copy(), events, self.now)
        for end, nid, gpus in self.book.hold_events():
            est.hold(nid, gpus, until=end)
        return est

    # -- explanations -----------------------------------------------------------------
    def explain_waits(self, ordered: list[tuple[Key, JobRequest]]) -> tuple[PendingStatus, ...]:
        est = self.estimator()
        out: list[PendingStatus] = []
        slots: dict[str, list[float]] = {}  # per array held back by its limit: when a slot frees
        for _, job in ordered:
            wait = self.waits.get(job.id)
            if wait is None:
                continue  # started
            eta: float | None = None
            if wait.code == "JobArrayTaskLimit":
                eta = self.array_slot(job, slots, floor=est.t)
            elif wait.options is not None:
                booked = est.earliest(wait.options)
                if booked is not None:
                    eta = est.t
                    est.book(booked[0], booked[1], self.policy.limit(job))
            out.append(
                PendingStatus(
                    job_id=job.id,
                    position=len(out) + 1,
                    estimated_start=eta,
                    status=wait.status,
                    reason=self.reason(wait),
                )
            )
        return tuple(out)

    def array_slot(self, job: JobRequest, slots: dict[str, list[float]], *, floor: float) -> float:
        """A task held back by its array's limit starts when one of the array's running
        tasks ends (each assumed to run to its time limit), in queue order: the first
        waiting task takes the earliest end, and so on, each freeing its slot again
        after its own limit. Never before the queue's estimate so far (``floor``). It
        books no GPUs in the estimate (the limit, not the GPUs, holds it back)."""
        array = job.array or ""
        heap = slots.get(array)
        if heap is None:
            limit = self.policy.limit
            heap = [
                max(self.now, rj.started_at + limit(rj.job))
                for rj in self.snap.running
                if rj.job.array == array and rj.job.id not in self.preempted
            ]
            heap += [self.now + limit(j) for j in self.started.values() if j.array == array]
            heap.sort()  # more running than the limit (it was lowered): the first few free no slot
            heap = heap[max(0, len(heap) - job.array_limit) :] or [self.now]
            heapq.heapify(heap)
            slots[array] = heap
        start = max(floor, heapq.heappop(heap))
        heapq.heappush(heap, start + self.policy.limit(job))
        return start

    def reason(self, wait: _Wait) -> str:
        if wait.code != "Resources" or wait.options is None or wait.detail:
            return f"{wait.code}: {wait.detail}"
        # Free capacity no longer changes here, and jobs of one shape share one options
        # list (options_cache): the reason is the same for all of them.
        hit = self.reasons.get(id(wait.options))
        if hit is None:
            hit = self.reasons[id(wait.options)] = self._resources_reason(wait.options)
        return hit

    def _resources_reason(self, options: Options) -> str:
        gk, shape = options[0]
        groups = [self.cap.groups[k] for k, _ in options]
        block = max(g.largest_block() for g in groups)
        free = sum(g.total for g in groups)
        model = gk[1] if len(groups) == 1 else "eligible"
        return (
            f"Resources: needs {describe_shape(shape)}, largest free block {block}, {free} {model} GPUs free"
        )

    def fragmentation(self, ordered: list[tuple[Key, JobRequest]]) -> float:
        """Share of free GPUs (in the groups the head waiting job may use) that sit on
        nodes with too few free GPUs for one of its per-node parts. 0 when nothing waits
        for resources or nothing is free."""
        for _, job in ordered:
            wait = self.waits.get(job.id)
            if wait is None or wait.options is None or wait.status is not Status.UNSCHEDULABLE:
                continue
            free = usable = 0
            for gk, shape in wait.options:
                group = self.cap.groups[gk]
                free += group.total
                smallest = shape[-1]
                usable += sum(f * len(group.by_free[f]) for f in range(smallest, group.info.size + 1))
            return 0.0 if free == 0 else 1.0 - usable / free
        return 0.0
