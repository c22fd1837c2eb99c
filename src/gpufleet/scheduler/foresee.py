"""Preemptions foreseen in estimated starts: a waiting job that will be able to preempt
running jobs is booked when it could, not only when GPUs come free.

A running job becomes a victim of a waiting job (its key above the waiting job's
``Policy.victim_floor``) from ``Policy.preemptible_from`` (``default``: ``min_run_s``
after its start); a waiting job that starves (``Policy.promoted``) may preempt more from
then on. Only jobs running now are victims (jobs booked in the estimate are not), each
once, and never before the estimate of the job before (a promise in queue order): the
job is booked at the first such moment, before its GPUs would otherwise come free, at
which the victims free then (worst-ranked first) make its shape fit; their end events
are cancelled.
"""

from __future__ import annotations

import math

from gpufleet.scheduler.capacity import GroupKey
from gpufleet.scheduler.cycle import CycleState
from gpufleet.scheduler.estimate import Estimator
from gpufleet.scheduler.model import JobRequest, RunningJob
from gpufleet.scheduler.placement import Shape
from gpufleet.scheduler.policies.base import Key

__all__ = ["Foresight"]

MAX_TIMES = 8
"""Moments tried per waiting job (the earliest victims' availabilities)."""

MAX_VICTIMS = 32
"""Victims looked at per waiting job (the worst-ranked live ones, as ``preempt.py`` picks)."""

_NO_ROOM: tuple[GroupKey, Shape] = (("", ""), ())
"""``Foresight._try``: no room by preempting at the moments tried."""

_Victim = tuple[Key, float, RunningJob, list[tuple[int, int, int]]]  # key, from, job, (seq, node, GPUs)


class Foresight:
    """The running jobs as victims, worst-ranked first, for one estimate."""

    def __init__(self, cs: CycleState, est: Estimator) -> None:
        self.est = est
        self.cs = cs
        self.policy = cs.policy
        self.victims: list[_Victim] | None = None  # built on first use
        self.top: Key = ()
        self.taken: set[str] = set()
        self.failed: dict[int, tuple[float, int, Key, Key, float]] = {}
        """Per options list: (clock, victims taken, floors, promotion) of its last failure."""

    def _build(self) -> list[_Victim]:
        cs, est = self.cs, self.est
        parts: dict[str, list[tuple[int, int, int]]] = {}
        jobs: dict[str, RunningJob] = {}
        for seq, (rj, nid, n) in est.owners.items():
            jid = rj.job.id
            if jid not in jobs:
                jobs[jid] = rj
                parts[jid] = []
            parts[jid].append((seq, nid, n))
        policy = cs.policy
        if cs.keyed is not None:  # the pass ranked them already (preemptible ones only)
            keyed = [(e[0], e[3]) for e in cs.keyed.entries if e[3].job.id in jobs]
        else:
            keyed = [
                (policy.key(rj.job, rj, cs.ctx), rj)
                for rj in jobs.values()
                if rj.job.preemptible and rj.job.gpus and policy.preemptible_now(rj, cs.ctx)
            ]
        ready_from = policy.preemptible_from
        victims = [(k, ready_from(rj), rj, parts[rj.job.id]) for k, rj in keyed]
        if cs.keyed is not None and cs.keyed.ordered:
            victims.reverse()  # ascending by key already (keys end with the job id: no ties)
        else:
            victims.sort(key=_first, reverse=True)
        self.top = victims[0][0] if victims else ()
        return victims

    def book(
        self, key: Key, job: JobRequest, options: list[tuple[GroupKey, Shape]], run_s: float
    ) -> tuple[GroupKey, Shape] | None:
        """Book ``job`` (queue key ``key``) at the first moment it could start by
        preempting, if that comes before its GPUs come free; None when it does not (the
        caller books it as usual; the clock may have moved, never past a fit)."""
        est = self.est
        if self.victims is None:
            self.victims = self._build()
        if not self.victims:
            return None
        floor = self.policy.victim_floor(key)
        promo = self.policy.promoted(job, key)
        low, at = (floor, math.inf) if promo is None else (self.policy.victim_floor(promo[1]), promo[0])
        if not self.top > low:
            return None  # nobody it could ever preempt
        # Same clock, no victim taken since, GPUs only booked since: a job of the same
        # shape that may preempt no more, no sooner, failed before and fails again.
        memo = self.failed.get(id(options))
        if (
            memo is not None
            and memo[0] == est.t
            and memo[1] == len(self.taken)
            and not floor < memo[2]
            and not low < memo[3]
            and at >= memo[4]
        ):
            return None
        t0 = est.t
        fit = self._try(floor, low, at, options, run_s)
        if fit is _NO_ROOM:  # identity: a sentinel
            self.failed[id(options)] = (t0, len(self.taken), floor, low, at)
            return None
        return fit

    def _try(
        self, floor: Key, low: Key, at: float, options: list[tuple[GroupKey, Shape]], run_s: float
    ) -> tuple[GroupKey, Shape] | None:
        """The booking, None when it fits without preempting first, else ``_NO_ROOM``."""
        est = self.est
        assert self.victims is not None
        if est.earliest(options, until=est.t) is not None:
            return None  # it fits now
        gone = est.ended
        taken = self.taken
        ready: list[tuple[float, _Victim]] = []
        dead = 0
        for v in self.victims:
            vkey = v[0]
            if not vkey > low:
                break  # worst first: none after this qualifies either
            jid = v[2].job.id
            if jid in gone or jid in taken:
                dead += 1
                continue
            ready.append((v[1] if vkey > floor else max(v[1], at), v))
            if len(ready) == MAX_VICTIMS:
                break
        if dead > 32:
            self._compact(force=True)
        if not ready:
            self._compact()
            return _NO_ROOM
        times = sorted({max(est.t, w) for w, _ in ready})[:MAX_TIMES]
        for t in times:
            fit = est.earliest(options, until=t)
            if fit is not None:
                return None  # it fits before (or without) preempting: book as usual
            est.t = max(est.t, t)
            fit = self._free_victims(ready, t, options, run_s)
            if fit is not None:
                return fit
        return _NO_ROOM

    def _free_victims(
        self,
        ready: list[tuple[float, _Victim]],
        t: float,
        options: list[tuple[GroupKey, Shape]],
        run_s: float,
    ) -> tuple[GroupKey, Shape] | None:
        est = self.est
        cap = est.cap
        groups = cap.groups
        gone, taken = est.ended, self.taken
        given: list[_Victim] = []
        fit: tuple[GroupKey, Shape] | None = None
        for when, v in ready:
            if when > t or v[2].job.id in gone:
                continue
            for _, nid, n in v[3]:
                cap.give(nid, n)
            given.append(v)
            fit = next(((gk, shape) for gk, shape in options if groups[gk].fits(shape)), None)
            if fit is not None:
                break
        if fit is None:
            for v in given:
                for _, nid, n in v[3]:
                    cap.take(nid, n)
            return None
        for v in given:
            taken.add(v[2].job.id)
            est.cancelled.update(seq for seq, _, _ in v[3])
        est.book(fit[0], fit[1], run_s)
        return fit

    def _compact(self, *, force: bool = False) -> None:
        """Drop victims that ended or were taken (once they are half the list, unless
        ``force``: a scan skipped many)."""
        gone, taken = self.est.ended, self.taken
        victims = self.victims
        if victims is not None and (force or 2 * (len(gone) + len(taken)) >= len(victims)):
            victims = self.victims = [
                v for v in victims if v[2].job.id not in gone and v[2].job.id not in taken
            ]
            self.top = victims[0][0] if victims else ()


def _first(v: _Victim) -> Key:
    return v[0]
