"""Preemption candidates ranked by key, kept from one pass to the next when the policy
allows it.

The preemption step needs the key of every preemptible running job whenever a waiting
job does not fit: in a simulator replay that is most of ~180,000 passes, over ~150
running jobs each, nearly all of them the same objects as in the pass before, with the
same key. Policies whose running keys change only at known times say so through
``Policy.running_key`` (key, valid-until); for them ``RunningKeys`` keeps the ranking
sorted across passes and, per pass, only applies what the occupancy says changed (jobs
gone, jobs new) and re-keys the jobs whose time came. For other policies the ranking is
built afresh each pass. Either way the ranking is the same: ascending by (key, start
time), ties in running order, exactly as sorting the keys of every job would give.
0-GPU jobs are never candidates (stopping them frees no GPU).

Inside one rank class (jobs whose keys agree on the policy's first
``Policy.victim_class`` elements: equally eligible, as far as the policy can tell) the
preemption step takes the job that loses least per GPU it frees first (``cheapest_first``:
the time since its last checkpoint, ``since_checkpoint``), so a job that just checkpointed
is cheap; its reason states the whole loss, GPUs x that time (``lost_work``).

A ``RunningKeys`` lives on a FleetIndex, which the caller's ``PlanCache`` owns: one
caller, one thread, so it takes no lock.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable, Sequence
from operator import itemgetter

from gpufleet.scheduler.capacity import Flat, GroupKey, Holdings, Occupancy
from gpufleet.scheduler.model import RunningJob
from gpufleet.scheduler.policies.base import Context, Key, Policy

Entry = tuple[Key, float, int, RunningJob]  # (key, started_at, tie-break, job), sorted ascending
KeyFn = Callable[[RunningJob], tuple[Key, float]]
_key_of_entry = itemgetter(0)


class Victim:
    """A running job the preemption step may stop (``preempt.py``), with its GPUs."""

    __slots__ = ("flat", "gpus", "job", "key", "parts")

    def __init__(
        self, key: Key, job: RunningJob, parts: Holdings, gpus: dict[GroupKey, int], flat: Flat
    ) -> None:
        self.key = key
        self.job = job
        self.parts = parts  # GPUs it holds, per group
        self.gpus = gpus  # how many of them count as capacity, per group
        self.flat = flat  # (node, GPUs that count) per part, all groups


class Ranking:
    """Preemptible running jobs ascending by (key, start); read-only for the pass.
    ``ordered`` False: ``entries`` are in running order and are sorted only as far as
    asked (a one-off pass rarely needs more than the jobs above the first floor)."""

    __slots__ = ("entries", "ordered")

    def __init__(self, entries: list[Entry], *, ordered: bool) -> None:
        self.entries = entries
        self.ordered = ordered

    @property
    def worst_key(self) -> Key:
        if not self.entries:
            return ()
        return self.entries[-1][0] if self.ordered else max(map(_key_of_entry, self.entries))

    def above(self, floor: Key) -> list[tuple[Key, RunningJob]]:
        """(key, job) of jobs whose key is above ``floor``, worst-ranked first."""
        entries = self.entries
        if self.ordered:
            picked = entries[bisect_right(entries, floor, key=_key_of_entry) :]
        else:
            picked = sorted((e for e in entries if e[0] > floor), key=_sort_key)
        return [(e[0], e[3]) for e in reversed(picked)]


def lost_work(rj: RunningJob, now: float) -> float:
    """GPU-seconds ``rj`` loses if it is stopped at ``now``: its GPUs x the time since its
    last checkpoint, that is its run time in this attempt modulo its declared interval
    (``JobRequest.checkpoint_s``). A job that declared none may have saved nothing: it
    loses its whole attempt (the conservative reading; a requeued job restarts from its
    last checkpoint, so earlier attempts are not counted)."""
    ran = now - rj.started_at
    if ran <= 0.0:
        return 0.0
    every = rj.job.checkpoint_s
    if every is not None and every > 0.0:
        ran %= every
    return rj.job.gpu_weight * ran


def lost_work_words(rj: RunningJob, now: float) -> str:
    """``lost_work`` as a preemption's reason says it."""
    hours = lost_work(rj, now) / 3600.0
    every = rj.job.checkpoint_s
    since = (
        f"since its last checkpoint (every {every:g}s)"
        if every is not None and every > 0.0
        else "since it started (no checkpoint interval declared)"
    )
    return f"loses {hours:.2f} GPU-h {since}"


def cheapest_first(victims: list[Victim], width: int, now: float) -> list[Victim]:
    """``victims`` (worst-ranked first) with each run of one rank class (keys equal in
    their first ``width`` elements) ordered by the work lost per GPU freed
    (``since_checkpoint``), least first; equal losses
    keep their rank order. ``width`` 0: as they are. The classes stay in rank order, so
    floors that split keys only between classes (``Policy.victim_floor``) still split
    the list in two."""
    if width <= 0 or len(victims) < 2:
        return victims
    out: list[Victim] = []
    run: list[Victim] = []
    prefix: Key | None = None
    for v in victims:
        p = v.key[:width]
        if p != prefix:
            _flush(out, run, now)
            run, prefix = [], p
        run.append(v)
    _flush(out, run, now)
    return out


def since_checkpoint(rj: RunningJob, now: float) -> float:
    """Seconds of work ``rj`` loses per GPU if stopped at ``now`` (``lost_work`` over its
    GPUs): what a preemption pays for each GPU it frees."""
    ran = now - rj.started_at
    if ran <= 0.0:
        return 0.0
    every = rj.job.checkpoint_s
    return ran % every if every is not None and every > 0.0 else ran


def _flush(out: list[Victim], run: list[Victim], now: float) -> None:
    """A rank class, least work lost *per GPU freed* first: victims are taken until the
    preemptor's GPUs are free, so the loss per GPU is what the order should minimise (a
    1-GPU job that ran 1 h is not cheaper than an 8-GPU job that checkpointed a minute
    ago). Without declared intervals this is the newest start first, as before."""
    if len(run) > 1:
        run.sort(key=lambda v: since_checkpoint(v.job, now))
    out += run


def rank_running(
    policy: Policy,
    cache: RunningKeys | None,
    occ: Occupancy | None,
    running: Sequence[RunningJob],
    ctx: Context,
) -> Ranking:
    """The pass's preemption candidates: from ``cache`` when it has followed the
    occupancies up to ``occ`` (see ``RunningKeys.observe``), else afresh."""
    if cache is not None and occ is not None:
        got = cache.ranking(occ, ctx.now, lambda rj: policy.running_key(rj, ctx))
        if got is not None:
            return got
    ok = policy.preemptible_now
    key = policy.key
    entries = [
        (key(rj.job, rj, ctx), rj.started_at, -i, rj)
        for i, rj in enumerate(running)
        if rj.job.preemptible and rj.job.gpus and ok(rj, ctx)
    ]
    return Ranking(entries, ordered=False)


def _sort_key(e: Entry) -> tuple[Key, float, int]:
    return e[0], e[1], e[2]


def caches_running_keys(policy: Policy) -> bool:
    """Whether ``policy`` tells how long running keys hold and its candidates do not
    depend on time (``preemptible_now`` is the base's)."""
    cls = type(policy)
    return cls.running_key is not Policy.running_key and cls.preemptible_now is Policy.preemptible_now


class RunningKeys:
    """One policy's ranking over one fleet's occupancy, from pass to pass.

    Holds the last Occupancy it saw (so its id stays unique): the next one, derived from
    it, lists exactly the jobs that left and came. Ties between equal keys (policies end
    keys with the job id, so there are none in practice) go to the job cached first,
    where a fresh ranking would put the job earlier in ``running``: the same when the
    caller keeps the order of ``running`` stable, as the simulator and server do.
    """

    __slots__ = ("backlog", "built", "chained", "entries", "expiry", "occ", "seq", "slot")

    def __init__(self) -> None:
        self.occ: Occupancy | None = None
        self.entries: list[Entry] = []
        self.slot: dict[int, tuple[Entry, float]] = {}  # id(job) -> (its entry, valid until)
        self.expiry: list[tuple[float, int, int]] = []  # heap of (until, tie-break, id)
        self.seq = 0
        self.built = False  # entries hold every job of ``occ`` but the backlog
        self.chained = False  # ``occ`` was derived from the one before it
        self.backlog: list[tuple[Sequence[RunningJob], Sequence[RunningJob]]] = []

    def observe(self, occ: Occupancy) -> None:
        """Follow this pass's occupancy (every pass, whether it ranks or not). One not
        derived from the last makes the cache start over; callers that hand in new
        objects every pass thus never build it."""
        last, self.occ = self.occ, occ
        if last is not None and occ.parent == id(last):
            self.chained = True
            if self.built:
                self.backlog.append((occ.gone, occ.new))
                if len(self.backlog) > 64:
                    self.built = False  # cheaper to key everything again
        else:
            self.chained = self.built = False
            self.entries, self.slot, self.expiry, self.backlog = [], {}, [], []

    def ranking(self, occ: Occupancy, now: float, key_of: KeyFn) -> Ranking | None:
        """The ranking for ``occ``, or None when the cache did not follow up to it."""
        if occ is not self.occ or not self.chained:
            return None
        if not self.built:  # the first pass of a chain that ranks: key everything once
            self._rebuild(occ.jobs.values(), key_of)
            self.backlog, self.built = [], True
        else:
            self._apply(now, key_of)
        return Ranking(list(self.entries), ordered=True)

    def _apply(self, now: float, key_of: KeyFn) -> None:
        """Jobs gone and new since the last ranking, and keys whose time came."""
        for gone, new in self.backlog:
            for rj in gone:
                self._drop(id(rj))
            for rj in new:
                self._put(rj, key_of)
        self.backlog = []
        expiry, slot = self.expiry, self.slot
        due: list[RunningJob] = []
        while expiry and expiry[0][0] <= now:
            _, seq, i = heapq.heappop(expiry)
            hit = slot.get(i)
            if hit is not None and hit[0][2] == -seq:  # not a row of a job that left or was re-keyed
                due.append(hit[0][3])
                self._drop(i)
        for rj in due:
            self._put(rj, key_of)
        if len(expiry) > 2 * len(slot) + 64:  # rows of jobs that left long ago
            self.expiry = [(u, -e[2], i) for i, (e, u) in slot.items() if u != math.inf]
            heapq.heapify(self.expiry)

    def _rebuild(self, running: Iterable[RunningJob], key_of: KeyFn) -> None:
        """Key everything afresh (one sort, not one insertion per job)."""
        self.entries, self.slot, self.expiry = [], {}, []
        for rj in running:
            if rj.job.preemptible and rj.job.gpus:
                key, until = key_of(rj)
                self.seq += 1
                entry = (key, rj.started_at, -self.seq, rj)
                self.entries.append(entry)
                self.slot[id(rj)] = (entry, until)
                if until != math.inf:
                    self.expiry.append((until, self.seq, id(rj)))
        self.entries.sort(key=_sort_key)
        heapq.heapify(self.expiry)

    def _put(self, rj: RunningJob, key_of: KeyFn) -> None:
        if not rj.job.preemptible or not rj.job.gpus:
            return
        key, until = key_of(rj)
        self.seq += 1
        entry = (key, rj.started_at, -self.seq, rj)
        insort(self.entries, entry, key=_sort_key)
        self.slot[id(rj)] = (entry, until)
        if until != math.inf:
            heapq.heappush(self.expiry, (until, self.seq, id(rj)))

    def _drop(self, i: int) -> None:
        hit = self.slot.pop(i, None)
        if hit is None:
            return
        entry = hit[0]
        at = bisect_left(self.entries, _sort_key(entry), key=_sort_key)
        assert self.entries[at] is entry
        del self.entries[at]
