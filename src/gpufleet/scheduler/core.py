"""``plan(snapshot, policy) -> Plan``: the one scheduling pass that the server and the
simulator both call.

Pipeline (each step a function that receives the pass's ``CycleState``, cycle.py)::

    snapshot --split: held teams' jobs, blocked jobs (deps.py), 0-GPU jobs, GPU jobs-->
    --index--> capacity (cycle.new_cycle)
    --reservations starting: preempt/move (preempt.clear_reserved_gpus)--> --order-->
    for each waiting GPU job (consider):
        options (group, shape)   Unschedulable reasons are data, not exceptions (filters.py)
        quota filter             team hard limits
        limits                   array limit, QOS, licenses, CPUs/memory ever fitting
        place                    own reservation first, then the job's view of free GPUs
                                 (placing.py, reservations.py), topology-aware best fit
                                 (placement.py)
        | backfill guard         EASY: do not delay the reserved head job (backfill.py)
        | preempt                lower-key victims, fewest needed (preempt.py, release.py)
    --> 0-GPU jobs in queue order: the least-loaded node of their pool (cpu.py)
    --> explain (explain.py): queue positions, estimated starts (estimate.py), reasons,
        fragmentation; then 0-GPU jobs that found no node, then held jobs (no position,
        no estimate), then blocked jobs (no position; estimated start: their
        predecessors' latest end)

Pure: no clock, no I/O, no randomness, no state kept between calls (what a caller
wants reused lives in its ``PlanCache``); ties are broken by the snapshot's own order,
so the same snapshot gives the same plan, with or without a cache.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from gpufleet.scheduler.backfill import reserve
from gpufleet.scheduler.cache import PlanCache
from gpufleet.scheduler.cpu import CpuPlacer
from gpufleet.scheduler.cycle import CycleState, NoFitKey, Wait, new_cycle
from gpufleet.scheduler.explain import explain_waits, fragmentation, outside_queue
from gpufleet.scheduler.filters import count_array, limit_wait, options
from gpufleet.scheduler.model import JobRequest, PendingStatus, Placement, Plan, Snapshot, Start, Status
from gpufleet.scheduler.options import Options, gpu_type_matches, job_options, shared_options
from gpufleet.scheduler.placing import cap_fits, general_view, is_long, place, reservation_wait
from gpufleet.scheduler.policies import Policy, make_policy
from gpufleet.scheduler.policies.base import Key
from gpufleet.scheduler.preempt import clear_reserved_gpus, preempt_for

__all__ = ["Options", "PlanCache", "gc_paused", "gpu_type_matches", "job_options", "plan", "shared_options"]


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
        return run(new_cycle(snapshot, policy, explain, cache))
    with gc_paused():
        return run(new_cycle(snapshot, policy, explain, cache))


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


def run(cs: CycleState) -> Plan:
    """The pass over the state ``new_cycle`` built: GPU jobs in the policy's order, then
    0-GPU jobs, then (with ``explain``) where every waiting job stands."""
    policy = cs.policy
    if cs.book:
        clear_reserved_gpus(cs)
    power = cs.power

    def full() -> bool:  # no GPU free, or (rack power budgets) none that a rack can power
        return cs.cap.total_free == 0 or (power is not None and power.dry(cs.cap.free))

    if not cs.explain and not policy.preemptive and full():
        ordered = []  # nothing can start: skip ordering the queue
    else:
        ordered = policy.order(cs.gpu_pending, cs.ctx)
    stop_early = not cs.explain and not policy.preemptive
    for key, job in ordered:
        if stop_early and (cs.strict_blocker is not None or full()):
            break
        consider(cs, key, job)
    cpu_starts, unplaced = start_cpu_jobs(cs) if cs.cpu_pending else ([], [])
    pending: tuple[PendingStatus, ...] = ()
    if cs.explain:
        queued = explain_waits(cs, ordered)
        pending = queued + outside_queue(cs, unplaced, queued)
    return Plan(
        policy=policy.name,
        starts=(*cs.starts, *cpu_starts),
        preemptions=tuple(cs.preemptions),
        reservation_moves=tuple(cs.book.moves),
        pending=pending,
        fragmentation=fragmentation(cs, ordered),
        free_gpus=cs.cap.total_free,
    )


def consider(cs: CycleState, key: Key, job: JobRequest) -> None:
    """One waiting GPU job (queue key ``key``): start it, preempt for it, or record why
    it waits (``cs.waits``); the first that finds no resources sets the strict blocker
    or EASY backfill's shadow, as the policy says."""
    opts = options(cs, job)
    if isinstance(opts, str):
        cs.waits[job.id] = Wait(Status.UNRESOLVABLE, "Unschedulable", opts)
        return
    quota = cs.ctx.quotas.get(job.team)
    if quota is not None and quota.limit is not None:
        held = cs.ctx.team_gpus.get(job.team, 0)
        if held + job.gpu_weight > quota.limit:
            cs.waits[job.id] = Wait(
                Status.UNSCHEDULABLE,
                "QuotaLimit",
                f"team {job.team} holds {held:g} of its {quota.limit}-GPU limit, "
                f"job needs {job.gpu_weight:g}",
                opts,
            )
            return
    asks = cs.res is not None and (job.cpus > 0 or job.mem_mb > 0)
    if (job.array_limit > 0 or cs.qos.limits or job.licenses or asks or job.cuda is not None) and (
        limited := limit_wait(cs, job, opts, asks)
    ) is not None:
        cs.waits[job.id] = limited
        return
    if cs.strict_blocker is not None:
        cs.waits[job.id] = Wait(
            Status.UNSCHEDULABLE, "Priority", f"strict order: behind job {cs.strict_blocker}", opts
        )
        return
    policy = cs.policy
    limit = policy.limit(job)
    # Without preemption or reservations free capacity only shrinks during a pass, so a
    # job shaped like one that did not fit will not fit either: skip the search.
    same: NoFitKey | None = None
    if not policy.preemptive and not cs.book and job.reservation is None:
        same = (id(opts), is_long(cs, limit), job.cpus, job.mem_mb, job.constraint, job.exclude, job.cuda)
        hit = cs.nofit.get(same)
        if hit is not None:
            cs.waits[job.id] = hit
            return
    cs.masked = False
    placement = place(cs, job, opts, limit)
    if placement is None and job.reservation is not None:
        cs.waits[job.id] = Wait(Status.UNSCHEDULABLE, "Reservation", reservation_wait(cs, job), opts)
        return
    filtered = job.constraint is not None or bool(job.exclude) or job.cuda is not None  # victims: any node
    if placement is None and policy.preemptive and not asks and not filtered:  # nor for CPUs
        view = general_view(cs, job, limit)
        if cs.power is None or not cs.power.holds_back(view, opts):  # never preempt for power
            placement = preempt_for(cs, key, job, opts, view)
    if placement is not None:
        record_start(cs, job, placement)
        return
    cs.waits[job.id] = wait = _no_room(cs, job, opts)
    if same is not None and (wait.code in ("Resources", "Power") or not cs.explain):
        cs.nofit[same] = wait  # a "Priority" reason could turn into "Resources" later
    if wait.code not in ("Resources", "Power"):
        return
    if policy.backfill == "none":
        cs.strict_blocker = job.id
    elif policy.backfill == "easy" and cs.shadow is None and wait.code == "Resources":
        reserve(cs, job, opts)  # (a shadow books GPUs, not watts: none for Power)


def _no_room(cs: CycleState, job: JobRequest, opts: Options) -> Wait:
    """Why ``job`` found no GPUs: behind the backfill shadow, no node with its CPUs or
    memory free, or simply no room."""
    if cs.shadow is not None and cap_fits(cs, opts):
        return Wait(
            Status.UNSCHEDULABLE,
            "Priority",
            f"would delay job {cs.shadow.job_id}, reserved to start first",
            opts,
        )
    if cs.masked and cs.res is not None:
        needs = cs.res.describe(job)
        return Wait(
            Status.UNSCHEDULABLE, "Resources", f"needs {needs} per node, free on no node that fits", opts
        )
    if cs.power is not None and cs.power.holds_back(cs.cap, opts):  # no estimate: watts, not GPUs
        return Wait(Status.UNSCHEDULABLE, "Power", cs.power.describe(cs.index, opts))
    return Wait(Status.UNSCHEDULABLE, "Resources", options=opts)


def record_start(cs: CycleState, job: JobRequest, placement: Placement) -> None:
    """``job`` starts at ``placement``: every count that limits later jobs takes it."""
    cs.starts.append(Start(job_id=job.id, placement=placement))
    cs.started[job.id] = job
    cs.ctx.add_team_gpus(job.team, job.gpu_weight)
    cs.qos.take(job)
    cs.licenses.take(job)
    if job.array is not None:
        count_array(cs, job.array)
    if cs.res is not None and (job.cpus or job.mem_mb):
        cs.res.take((p.node for p in placement), job)


def start_cpu_jobs(cs: CycleState) -> tuple[list[Start], list[tuple[JobRequest, str]]]:
    """0-GPU jobs, in the policy's order, after the GPU jobs (whose starts and
    preemptions count on their nodes): their starts, and the jobs that found no
    node, with why. Kept apart from ``starts``: they hold no GPU to estimate with."""
    placer = CpuPlacer(
        cs.snap.fleet, cs.snap.running, preempted=cs.preempted, starts=cs.starts, resources=cs.res
    )
    starts: list[Start] = []
    unplaced: list[tuple[JobRequest, str]] = []
    for _, job in cs.policy.order(cs.cpu_pending, cs.ctx):
        asks = cs.res is not None and bool(job.cpus or job.mem_mb)
        if (limited := limit_wait(cs, job, None, asks)) is not None:
            unplaced.append((job, f"{limited.code}: {limited.detail}"))
            continue
        got = placer.place(job)
        if isinstance(got, str):
            unplaced.append((job, got))
        else:
            starts.append(got)
            cs.qos.take(job)
            cs.licenses.take(job)
            if job.array is not None:
                count_array(cs, job.array)
    return starts, unplaced
