"""Estimated start times: play the future forward on GPU counts.

Running jobs end where their predicted run time does (``JobRequest.predicted_s``; a
job past its prediction runs ``Policy.overrun_share`` of what it ran again), never after
their time limit; jobs without a prediction at their time limit (Slurm's assumption; a
job past its limit is assumed to end now). Waiting jobs are booked for their predicted
run time, else their limit (``Policy.expected_s``), one after another in queue order,
each at the earliest moment its shape fits, never earlier than the job before it
(so an estimate is a promise in queue order, not a backfill guess). Every booking is
a heap push, so estimating 10,000 waiting jobs costs O(n log n).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

from gpufleet.scheduler.capacity import Capacity, GroupKey
from gpufleet.scheduler.model import JobRequest, RunningJob, Start
from gpufleet.scheduler.placement import Shape, choose_nodes
from gpufleet.scheduler.policies.base import Policy

Event = tuple[float, int, int, int]  # (time, node id, seq, GPUs)
"""Ends at one time come free in node order, whatever order the running jobs came in (the
server's snapshot and the simulator's list them differently): the capacity's buckets, and
so the nodes a booking picks, must not depend on it."""


def release_events(
    cap: Capacity,
    running: Iterable[RunningJob],
    started: Iterable[JobRequest],
    starts: Iterable[Start],
    policy: Policy,
    now: float,
    owners: dict[int, tuple[RunningJob, int, int]] | None = None,
) -> list[Event]:
    """When the GPUs held now come free (``expected_end``); ``owners`` gets the running
    job, node and GPUs of each of their events (by seq)."""
    id_of = cap.index.id_of
    events: list[Event] = []
    for rj in running:
        end = expected_end(policy, rj, now)
        for part in rj.placement:
            nid = id_of.get(part.node)
            if nid is not None:
                n = cap.countable(nid, part.gpus)
                if n:
                    if owners is not None:
                        owners[len(events)] = (rj, nid, n)
                    events.append((end, nid, len(events), n))
    for job, start in zip(started, starts, strict=True):
        end = now + policy.expected_s(job, job.executed_s)
        for part in start.placement:
            events.append((end, id_of[part.node], len(events), len(part.gpus)))
    heapq.heapify(events)
    return events


def expected_end(policy: Policy, rj: RunningJob, now: float) -> float:
    """When ``rj`` is expected to end: its predicted end (``Policy.expected_s``) capped by
    its attempt's time limit, else that limit; never before ``now``."""
    job = rj.job
    p = job.predicted_s
    if p is None:
        return max(now, rj.started_at + policy.limit(job))
    ran = rj.executed_s(now)
    # Not ``now + (p - ran)``: the same end on every clock (the server's epoch seconds,
    # the simulator's trace seconds), so both take the same decisions.
    end = rj.started_at + (p - job.executed_s) if p > ran else now + policy.expected_s(job, ran)
    if job.time_limit_s is not None:
        end = min(end, rj.started_at + job.time_limit_s)
    return max(now, end)


class Estimator:
    """A count-only copy of the capacity moving forward in time."""

    def __init__(self, cap: Capacity, events: list[Event], now: float) -> None:
        self.cap = cap
        self.events = events
        self.t = now
        self.seq = len(events)
        self.cancelled: set[int] = set()
        """Seqs of events that will not come (their job was booked as preempted)."""
        self.owners: dict[int, tuple[RunningJob, int, int]] = {}
        """The running job, node and GPUs of an event, by seq (``release_events``), for ``ended``."""
        self.ended: set[str] = set()
        """Running jobs whose end has come in the estimate (no victims any more)."""

    def earliest(
        self, options: list[tuple[GroupKey, Shape]], until: float = math.inf
    ) -> tuple[GroupKey, Shape] | None:
        """Advance the clock until one of ``options`` fits; None if it never will, or not
        by ``until`` (the clock then stays at or before it)."""
        groups = self.cap.groups
        events = self.events
        cancelled, owners = self.cancelled, self.owners
        while True:
            for gk, shape in options:
                if groups[gk].fits(shape):
                    return gk, shape
            if not events or events[0][0] > until:
                return None
            t = events[0][0]
            while events and events[0][0] <= t:
                _, nid, seq, n = heapq.heappop(events)
                if seq in cancelled:
                    continue
                if owners:
                    owner = owners.pop(seq, None)
                    if owner is not None:
                        self.ended.add(owner[0].job.id)
                self.cap.give(nid, n)
            if t > self.t:
                self.t = t

    def hold(self, nid: int, gpus: int, *, until: float) -> None:
        """Count ``gpus`` free GPUs of a node as busy until ``until`` (reservations)."""
        taken = min(gpus, self.cap.free[nid])
        if taken > 0:
            self.cap.take(nid, taken)
            heapq.heappush(self.events, (until, nid, self.seq, taken))
            self.seq += 1

    def book(self, gk: GroupKey, shape: Shape, duration: float) -> None:
        counts = choose_nodes(self.cap, gk, shape)
        assert counts is not None
        end = self.t + duration
        for nid, c in counts:
            self.cap.take(nid, c)
            heapq.heappush(self.events, (end, nid, self.seq, c))
            self.seq += 1
