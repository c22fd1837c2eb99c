"""The checks a waiting job passes before any placement is tried (Kubernetes' filter
point): where it could ever run (its options), its array's task limit, QOS limits,
licenses, the CUDA it needs (``cuda.py``), and whether its CPUs or memory fit on any
node of its pool at all. A job that
fails one waits with the reason as a value (``cycle.Wait``); GPU and 0-GPU jobs go
through the same checks (``core.consider``, ``core.start_cpu_jobs``).
"""

from __future__ import annotations

from gpufleet.scheduler.cuda import cuda_wait
from gpufleet.scheduler.cycle import CycleState, Wait
from gpufleet.scheduler.model import JobRequest, Status
from gpufleet.scheduler.options import Options, shared_options

__all__ = ["array_full", "count_array", "limit_wait", "never_fits", "options"]


def options(cs: CycleState, job: JobRequest) -> Options | str:
    """The groups and per-node shapes ``job`` could ever run in, or why there are none
    (one list per shape, shared by the jobs of that shape)."""
    ck = (job.gpus, job.gpus_per_node, job.nodes, job.gpu_type, job.pool)
    hit = cs.options_cache.get(ck)
    if hit is None:
        hit = cs.options_cache[ck] = shared_options(cs.index, job)
    return hit


def limit_wait(cs: CycleState, job: JobRequest, opts: Options | None, asks: bool) -> Wait | None:
    """Why ``job`` may not start now whatever is free: its array's limit, a QOS limit,
    licenses, or (``asks``: it asks for CPUs or memory and they are tracked) CPUs or
    memory that fit on no node of its pool, ever (None: none of these holds it back)."""
    if job.array_limit > 0 and (full := array_full(cs, job)) is not None:
        return Wait(Status.UNSCHEDULABLE, "JobArrayTaskLimit", full, opts)
    if cs.qos.limits and (over := cs.qos.blocked(job)) is not None:
        return Wait(Status.UNSCHEDULABLE, over[0], over[1], opts)
    if job.licenses and (short := cs.licenses.blocked(job)) is not None:
        return Wait(Status.UNSCHEDULABLE, "Licenses", short, opts)
    if job.cuda is not None and (old := cuda_wait(cs, job)) is not None:
        return old
    if asks and (never := never_fits(cs, job)) is not None:
        return Wait(Status.UNRESOLVABLE, "Unschedulable", never)
    return None


def array_full(cs: CycleState, job: JobRequest) -> str | None:
    """Why another task of ``job``'s array may not start now (None: it may)."""
    if cs.array_counts is None:
        cs.array_counts = {}
        for rj in cs.snap.running:
            if rj.job.array is not None and rj.job.id not in cs.preempted:
                count_array(cs, rj.job.array)
    n = cs.array_counts.get(job.array or "", 0)
    if n < job.array_limit:
        return None
    return f"array {job.array} runs {n} tasks, its limit is {job.array_limit}"


def count_array(cs: CycleState, array: str) -> None:
    """One more task of ``array`` runs (counted once the counts are built)."""
    if cs.array_counts is not None:
        cs.array_counts[array] = cs.array_counts.get(array, 0) + 1


def never_fits(cs: CycleState, job: JobRequest) -> str | None:
    """Why ``job``'s CPUs or memory fit on no node of its pool, ever (None: they may)."""
    assert cs.res is not None
    nodes = cs.pool_nodes.get(job.pool)
    if nodes is None:
        nodes = cs.pool_nodes[job.pool] = [n.name for n in cs.snap.fleet.nodes if n.pool == job.pool]
    return cs.res.never(job, nodes)
