"""What a policy is: a queue-sort key, a backfill mode and, optionally, preemption.

The core runs one pipeline for every policy (``gpufleet.scheduler.core``); a policy only
fills its extension points, as a Kubernetes scheduler plugin does:

- ``key``: the queue-sort extension point. Smaller keys go first. Running jobs get a key
  in the same space, so the preemption step can compare a waiting job with a victim.
- ``backfill``: what happens behind a job that cannot start:
  ``none`` (strict order: nothing behind it starts), ``greedy`` (anything that fits
  starts) or ``easy`` (EASY backfill: the first blocked job gets a reservation at its
  earliest start; later jobs start only if they do not delay it).
- ``can_preempt``: the preemption extension point (only consulted when ``preemptive``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from gpufleet.scheduler.model import JobRequest, Quota, RunningJob, Snapshot

BackfillMode = Literal["none", "greedy", "easy"]
Key = tuple[Any, ...]


class Context:
    """What a policy may look at besides the job: the clock of the snapshot, quotas
    and the GPUs each team holds (computed on first use; the core keeps it current
    during a pass as it starts and preempts jobs).

    ``memo``: where the policy may memoise per-object results (keys of waiting jobs,
    of running jobs) by name. The core passes the policy's memo from the caller's
    ``PlanCache``, so memos last as long as the caller keeps the cache; without one
    they last one pass. Policies keep no state of their own."""

    __slots__ = ("_running", "_team_gpus", "memo", "now", "quotas")

    def __init__(
        self,
        *,
        now: float,
        quotas: dict[str, Quota],
        running: Sequence[RunningJob] = (),
        memo: dict[str, dict[int, Any]] | None = None,
    ) -> None:
        self.now = now
        self.quotas = quotas
        self._running = running
        self._team_gpus: dict[str, float] | None = None
        self.memo: dict[str, dict[int, Any]] = {} if memo is None else memo

    @classmethod
    def of(cls, snapshot: Snapshot, memo: dict[str, dict[int, Any]] | None = None) -> Context:
        return cls(
            now=snapshot.now, quotas={q.team: q for q in snapshot.quotas}, running=snapshot.running, memo=memo
        )

    def memo_of(self, name: str) -> dict[int, Any]:
        """The memo called ``name`` (made on first use)."""
        hit = self.memo.get(name)
        if hit is None:
            hit = self.memo[name] = {}
        return hit

    @property
    def team_gpus(self) -> dict[str, float]:
        if self._team_gpus is None:
            held: dict[str, float] = {}
            for rj in self._running:
                held[rj.job.team] = held.get(rj.job.team, 0) + rj.job.gpu_weight
            self._team_gpus = held
        return self._team_gpus

    def add_team_gpus(self, team: str, delta: float) -> None:
        """Keep the per-team totals current during a pass (no-op until first used)."""
        if self._team_gpus is not None:
            self._team_gpus[team] = self._team_gpus.get(team, 0) + delta


@dataclass(frozen=True, kw_only=True)
class Policy:
    """Base policy: strict priority-then-FIFO order. Subclasses override the extension
    points; parameters are dataclass fields so they can be set from configuration."""

    name: ClassVar[str] = "base"
    backfill: ClassVar[BackfillMode] = "greedy"
    preemptive: ClassVar[bool] = False
    uses_oracle: ClassVar[bool] = False
    victim_class: ClassVar[int] = 0
    """How many leading elements of a running job's key make its rank class: victims of
    one class are equally eligible, and the one that loses least work is preempted first
    (``victims.cheapest_first``). ``victim_floor`` must split keys only between classes.
    0: the key alone orders victims."""

    default_time_limit_s: float = 4 * 3600.0
    """Assumed run time of a job that gave no time limit (Slurm's DefaultTime): used
    for estimated start times and backfill, never to stop a job."""

    foresee_preemptions: bool = False
    """Estimated starts foresee preemptions (``foresee.py``; preemptive policies only): a
    waiting job is booked when it could preempt, not only when GPUs come free. Off by
    default: it makes the pass slower (11-35 % at 1k-10k waiting jobs)."""

    overrun_share: float = 0.5
    """A job that has run past its prediction is assumed to run this share of what it
    has run again (heavy tails: the longer it ran, the longer it goes on), for
    estimated starts."""

    @property
    def static_pending_keys(self) -> bool:
        """True when a waiting job's key depends on the job alone (not on time or load)."""
        return True

    def limit(self, job: JobRequest) -> float:
        return job.time_limit_s if job.time_limit_s is not None else self.default_time_limit_s

    def expected_s(self, job: JobRequest, ran_s: float) -> float:
        """How much longer ``job`` is expected to run, having run ``ran_s`` wall seconds in
        all, for estimated starts: what is left of its prediction (``predicted_s``; past
        it, ``overrun_share`` of ``ran_s``), else its ``limit`` (a new attempt's). A
        running job's attempt still ends at its time limit (``estimate.expected_end``)."""
        p = job.predicted_s
        if p is None:
            return self.limit(job)
        left = p - ran_s if p > ran_s else self.overrun_share * ran_s
        limit = job.time_limit_s
        return left if limit is None else min(left, limit)

    def key(self, job: JobRequest, running: RunningJob | None, ctx: Context) -> Key:
        return (-job.priority, job.submit_time, job.id)

    def order(self, pending: Sequence[JobRequest], ctx: Context) -> list[tuple[Key, JobRequest]]:
        """Waiting jobs in the order to consider them, each with its key."""
        if not self.static_pending_keys:
            keyed = [(self.key(j, None, ctx), j) for j in pending]
        else:
            # A waiting job's key never changes, and callers (the simulator, the server
            # between passes) hand in the same JobRequest objects pass after pass: memoise
            # by identity. The memo holds the job, so an id cannot be reused while cached.
            memo: dict[int, tuple[Key, JobRequest]] = ctx.memo_of("order")
            if len(memo) > 400_000:
                memo.clear()
            keyed = []
            for j in pending:
                hit = memo.get(id(j))
                if hit is None or hit[1] is not j:
                    hit = memo[id(j)] = (self.key(j, None, ctx), j)
                keyed.append(hit)
        keyed.sort(key=_first)
        return keyed

    def running_key(self, running: RunningJob, ctx: Context) -> tuple[Key, float]:
        """A running job's ``key`` and a time before which it certainly stays the same.
        Policies that override this let the core keep running jobs' keys from pass to
        pass (victims.py); the base's keys may depend on anything, so it is not used."""
        return self.key(running.job, running, ctx), -math.inf

    def can_preempt(
        self, job: JobRequest, job_key: Key, victim: RunningJob, victim_key: Key, ctx: Context
    ) -> bool:
        return False

    def preempt_words(self, job: JobRequest, victim: RunningJob, now: float) -> str:
        """Why ``job`` may preempt ``victim``, for the preemption's reason ("": nothing to
        add to the preemptor, the policy and the work lost)."""
        return ""

    def preemptible_now(self, victim: RunningJob, ctx: Context) -> bool:
        """Whether ``victim`` may be preempted by anyone at this moment (e.g. it has
        run long enough). Consulted before ``can_preempt``, once per pass and job."""
        return True

    def preemptible_from(self, victim: RunningJob) -> float:
        """The earliest time anyone may preempt ``victim`` (estimated starts)."""
        return victim.started_at

    def promoted(self, job: JobRequest, job_key: Key) -> tuple[float, Key] | None:
        """When a waiting job's key improves with waiting alone, and to what (estimated
        starts: from then on it may preempt more); None if it never does."""
        return None

    def victim_floor(self, job_key: Key) -> Key:
        """Victims of a job with ``job_key`` must have keys strictly above this. The
        default (the job's own key) is right for any policy whose ``can_preempt``
        requires a worse key; a tighter floor only saves work."""
        return job_key

    def victim_scope(self, job: JobRequest) -> object:
        """Jobs with the same scope and a larger key never find more victims than an
        earlier one did; the core uses this to skip hopeless preemption searches."""
        return None


def _first(item: tuple[Key, JobRequest]) -> Key:
    return item[0]
