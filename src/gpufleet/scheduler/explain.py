"""The explanation step of a pass (``plan(..., explain=True)``): where every waiting job
stands once the decisions are made.

Queued GPU jobs get a position, an estimated start (``estimate.py``: running jobs end at
their predicted ends or time limits, waiting jobs are booked in queue order, under a
preemptive policy with ``foresee_preemptions`` as soon as they could preempt:
``foresee.py``) and a reason; then come 0-GPU jobs that found no node and held jobs
(no position, no estimate), then blocked jobs (no position; estimated start: their
predecessors' latest estimated end). Also the fragmentation figure of the plan.
Decisions are final here: nothing in this step changes what starts or is preempted.
"""

from __future__ import annotations

import heapq

from gpufleet.scheduler.backfill import estimator
from gpufleet.scheduler.cycle import CycleState, Wait
from gpufleet.scheduler.foresee import Foresight
from gpufleet.scheduler.model import JobRequest, PendingStatus, Status
from gpufleet.scheduler.options import Options
from gpufleet.scheduler.placement import describe_shape
from gpufleet.scheduler.policies.base import Key

__all__ = ["explain_waits", "fragmentation", "outside_queue"]


def explain_waits(cs: CycleState, ordered: list[tuple[Key, JobRequest]]) -> tuple[PendingStatus, ...]:
    """The queue's waiting GPU jobs in order, with positions, estimated starts and reasons."""
    foresee = cs.policy.preemptive and cs.policy.foresee_preemptions
    est = estimator(cs, owners=foresee)
    foresight = Foresight(cs, est) if foresee else None
    out: list[PendingStatus] = []
    slots: dict[str, list[float]] = {}  # per array held back by its limit: when a slot frees
    waits = cs.waits
    limit, expected_s = cs.policy.limit, cs.policy.expected_s
    for key, job in ordered:
        wait = waits.get(job.id)
        if wait is None:
            continue  # started
        eta: float | None = None
        if wait.code == "JobArrayTaskLimit":
            eta = _array_slot(cs, job, slots, floor=est.t)
        elif wait.options is not None:
            run_s = limit(job) if job.predicted_s is None else expected_s(job, job.executed_s)
            if foresight is not None and foresight.book(key, job, wait.options, run_s) is not None:
                eta = est.t
            else:
                booked = est.earliest(wait.options)
                if booked is not None:
                    eta = est.t
                    est.book(booked[0], booked[1], run_s)
        out.append(
            PendingStatus(
                job_id=job.id,
                position=len(out) + 1,
                estimated_start=eta,
                status=wait.status,
                reason=_reason(cs, wait),
            )
        )
    return tuple(out)


def _array_slot(cs: CycleState, job: JobRequest, slots: dict[str, list[float]], *, floor: float) -> float:
    """A task held back by its array's limit starts when one of the array's running
    tasks ends (each assumed to run to its time limit), in queue order: the first
    waiting task takes the earliest end, and so on, each freeing its slot again
    after its own limit. Never before the queue's estimate so far (``floor``). It
    books no GPUs in the estimate (the limit, not the GPUs, holds it back)."""
    array = job.array or ""
    heap = slots.get(array)
    limit = cs.policy.limit
    if heap is None:
        now = cs.now
        heap = [
            max(now, rj.started_at + limit(rj.job))
            for rj in cs.snap.running
            if rj.job.array == array and rj.job.id not in cs.preempted
        ]
        heap += [now + limit(j) for j in cs.started.values() if j.array == array]
        heap.sort()  # more running than the limit (it was lowered): the first few free no slot
        heap = heap[max(0, len(heap) - job.array_limit) :] or [now]
        heapq.heapify(heap)
        slots[array] = heap
    start = max(floor, heapq.heappop(heap))
    heapq.heappush(heap, start + limit(job))
    return start


def _reason(cs: CycleState, wait: Wait) -> str:
    if wait.code != "Resources" or wait.options is None or wait.detail:
        return f"{wait.code}: {wait.detail}"
    # Free capacity no longer changes here, and jobs of one shape share one options
    # list (``CycleState.options_cache``): the reason is the same for all of them.
    hit = cs.reasons.get(id(wait.options))
    if hit is None:
        hit = cs.reasons[id(wait.options)] = _resources_reason(cs, wait.options)
    return hit


def _resources_reason(cs: CycleState, options: Options) -> str:
    gk, shape = options[0]
    groups = [cs.cap.groups[k] for k, _ in options]
    block = max(g.largest_block() for g in groups)
    free = sum(g.total for g in groups)
    model = gk[1] if len(groups) == 1 else "eligible"
    return f"Resources: needs {describe_shape(shape)}, largest free block {block}, {free} {model} GPUs free"


def fragmentation(cs: CycleState, ordered: list[tuple[Key, JobRequest]]) -> float:
    """Share of free GPUs (in the groups the head waiting job may use) that sit on
    nodes with too few free GPUs for one of its per-node parts. 0 when nothing waits
    for resources or nothing is free."""
    for _, job in ordered:
        wait = cs.waits.get(job.id)
        if wait is None or wait.options is None or wait.status is not Status.UNSCHEDULABLE:
            continue
        free = usable = 0
        for gk, shape in wait.options:
            group = cs.cap.groups[gk]
            free += group.total
            smallest = shape[-1]
            usable += sum(f * len(group.by_free[f]) for f in range(smallest, group.info.size + 1))
        return 0.0 if free == 0 else 1.0 - usable / free
    return 0.0


def outside_queue(
    cs: CycleState, unplaced: list[tuple[JobRequest, str]], queued: tuple[PendingStatus, ...] = ()
) -> tuple[PendingStatus, ...]:
    """0-GPU jobs that found no node, then held jobs: no position, no estimate; then
    blocked jobs: no position, an estimate from their predecessors' (``queued``: the
    queue's statuses, for the estimated starts of waiting predecessors)."""
    out = [
        PendingStatus(
            job_id=job.id, position=None, estimated_start=None, status=Status.UNSCHEDULABLE, reason=why
        )
        for job, why in (*unplaced, *cs.held)
    ]
    if cs.blocked:
        etas = _blocked_etas(cs, queued)
        for job in cs.blocked:
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


def _blocked_etas(cs: CycleState, queued: tuple[PendingStatus, ...]) -> dict[str, float]:
    """A blocked job's estimated start: the latest estimated end of the jobs it waits
    for (running: started + limit; started this pass: now + limit; waiting: its
    estimated start + limit; blocked: its own estimate + limit), never before now.
    Unknown for any of them: no estimate."""
    limit = cs.policy.limit
    now = cs.now
    ends: dict[str, float] = {}
    for rj in cs.snap.running:
        if rj.job.id not in cs.preempted:
            ends[rj.job.id] = max(now, rj.started_at + limit(rj.job))
    for job in cs.started.values():
        ends[job.id] = now + limit(job)
    jobs = {j.id: j for j in cs.snap.pending}
    for st in queued:
        if st.estimated_start is not None and st.job_id in jobs:
            ends[st.job_id] = st.estimated_start + limit(jobs[st.job_id])
    etas: dict[str, float] = {}
    blocked = {j.id: j for j in cs.blocked}
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
            etas[job.id] = max(now, b.not_before)
            return etas[job.id]
        visiting.add(job.id)
        latest = max(now, b.not_before or now)
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

    for job in cs.blocked:
        eta(job)
    return etas
