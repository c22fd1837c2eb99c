"""EASY backfill in a pass: the reservation (the shadow) for the first job that found no
resources, and the estimator of future free capacity that it and the explanations read.

The shadow is when and where the reserved job will start if running jobs end at their
time limits; a later job may start now only where it does not delay that start: in the
GPUs the reserved job leaves over at its time (``Shadow.spare``), or anywhere if it ends
before then (``placing.is_long``).
"""

from __future__ import annotations

from gpufleet.scheduler.cycle import CycleState, Shadow
from gpufleet.scheduler.estimate import Estimator, release_events
from gpufleet.scheduler.model import JobRequest, RunningJob
from gpufleet.scheduler.options import Options
from gpufleet.scheduler.placement import choose_nodes

__all__ = ["estimator", "reserve"]


def reserve(cs: CycleState, job: JobRequest, opts: Options) -> None:
    """Set the shadow for ``job``: the earliest time and nodes its options fit (no
    shadow when they never do)."""
    est = estimator(cs)
    booked = est.earliest(opts)
    if booked is None:
        return
    gk, shape = booked
    counts = choose_nodes(est.cap, gk, shape)
    assert counts is not None
    at_shadow = est.cap.free
    spare = {nid: at_shadow[nid] for nid in cs.index.groups[gk].nodes}
    for nid, c in counts:
        spare[nid] -= c
    cs.shadow = Shadow(job_id=job.id, time=est.t, spare=spare)
    cs.book.set_spare(spare)


def estimator(cs: CycleState, *, owners: bool = False) -> Estimator:
    """Free capacity from now on, as the pass leaves it: running jobs (less those
    preempted) and jobs started in the pass end at their time limits; unused reserved
    GPUs count busy until their window ends. ``owners``: the estimator knows the
    running job of each end (``Estimator.owners``, for foreseen preemptions)."""
    running = [rj for rj in cs.snap.running if rj.job.id not in cs.preempted]
    of: dict[int, tuple[RunningJob, int, int]] | None = {} if owners else None
    events = release_events(cs.cap, running, cs.started.values(), cs.starts, cs.policy, cs.now, of)
    est = Estimator(cs.cap.counts_copy(), events, cs.now)
    if of is not None:
        est.owners = of
    for end, nid, gpus in cs.book.hold_events():
        est.hold(nid, gpus, until=end)
    return est
