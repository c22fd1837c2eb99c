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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from gpufleet.scheduler.model import JobRequest, Quota, RunningJob, Snapshot

BackfillMode = Literal["none", "greedy", "easy"]
Key = tuple[Any, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """What a policy may look at besides the job: the clock of the snapshot, quotas
    and the GPUs each team holds."""

    now: float
    quotas: dict[str, Quota]
    team_gpus: dict[str, int]

    @classmethod
    def of(cls, snapshot: Snapshot) -> Context:
        team_gpus: dict[str, int] = {}
        for rj in snapshot.running:
            team_gpus[rj.job.team] = team_gpus.get(rj.job.team, 0) + rj.job.gpus
        return cls(now=snapshot.now, quotas={q.team: q for q in snapshot.quotas}, team_gpus=team_gpus)


@dataclass(frozen=True, kw_only=True)
class Policy:
    """Base policy: strict priority-then-FIFO order. Subclasses override the extension
    points; parameters are dataclass fields so they can be set from configuration."""

    name: ClassVar[str] = "base"
    backfill: ClassVar[BackfillMode] = "greedy"
    preemptive: ClassVar[bool] = False
    uses_oracle: ClassVar[bool] = False

    default_time_limit_s: float = 4 * 3600.0
    """Assumed run time of a job that gave no time limit (Slurm's DefaultTime): used
    for estimated start times and backfill, never to stop a job."""

    def limit(self, job: JobRequest) -> float:
        return job.time_limit_s if job.time_limit_s is not None else self.default_time_limit_s

    def key(self, job: JobRequest, running: RunningJob | None, ctx: Context) -> Key:
        return (-job.priority, job.submit_time, job.id)

    def order(self, pending: Sequence[JobRequest], ctx: Context) -> list[tuple[Key, JobRequest]]:
        keyed = [(self.key(j, None, ctx), j) for j in pending]
        keyed.sort(key=_first)
        return keyed

    def can_preempt(
        self, job: JobRequest, job_key: Key, victim: RunningJob, victim_key: Key, ctx: Context
    ) -> bool:
        return False

    def victim_scope(self, job: JobRequest) -> object:
        """Jobs with the same scope and a larger key never find more victims than an
        earlier one did; the core uses this to skip hopeless preemption searches."""
        return None


def _first(item: tuple[Key, JobRequest]) -> Key:
    return item[0]
