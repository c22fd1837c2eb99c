"""``fairshare``: weighted max-min fair sharing of GPUs across teams (DRF with one
resource), with quota reclaim in the style of Kubernetes Kueue.

Order: progressive filling. Each team's jobs keep priority/FIFO order; the next job
overall comes from the team whose share ``held GPUs / weight`` would be lowest after
taking it. A team's weight is its quota's nominal ``gpus`` (``default_weight_gpus``
for teams without a quota).

Quotas: a team may borrow idle GPUs beyond its nominal quota (up to its hard ``limit``,
enforced for every policy). When a team that is within its nominal quota cannot start
a job, it reclaims GPUs by preempting jobs of teams that are above theirs, lowest share
first.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from gpufleet.scheduler.model import JobRequest, RunningJob
from gpufleet.scheduler.policies.base import BackfillMode, Context, Key, Policy


@dataclass(frozen=True, kw_only=True)
class FairSharePolicy(Policy):
    name: ClassVar[str] = "fairshare"
    backfill: ClassVar[BackfillMode] = "greedy"
    preemptive: ClassVar[bool] = True

    default_weight_gpus: float = 8.0

    def weight(self, team: str, ctx: Context) -> float:
        quota = ctx.quotas.get(team)
        return float(quota.gpus) if quota is not None and quota.gpus > 0 else self.default_weight_gpus

    def key(self, job: JobRequest, running: RunningJob | None, ctx: Context) -> Key:
        # Running jobs: the team's share now. Pending jobs are keyed in order().
        share = ctx.team_gpus.get(job.team, 0) / self.weight(job.team, ctx)
        return (-job.priority, share, job.submit_time, job.id)

    def order(self, pending: Sequence[JobRequest], ctx: Context) -> list[tuple[Key, JobRequest]]:
        queues: dict[str, list[JobRequest]] = {}
        for job in sorted(pending, key=lambda j: (-j.priority, j.submit_time, j.id)):
            queues.setdefault(job.team, []).append(job)
        held = {team: float(ctx.team_gpus.get(team, 0)) for team in queues}
        heap: list[tuple[int, float, str, int]] = []
        for team, jobs in queues.items():
            first = jobs[0]
            heap.append((-first.priority, (held[team] + first.gpu_weight) / self.weight(team, ctx), team, 0))
        heapq.heapify(heap)
        out: list[tuple[Key, JobRequest]] = []
        while heap:
            neg_prio, share, team, i = heapq.heappop(heap)
            job = queues[team][i]
            out.append(((neg_prio, share, job.submit_time, job.id), job))
            held[team] += job.gpu_weight
            if i + 1 < len(queues[team]):
                nxt = queues[team][i + 1]
                heapq.heappush(
                    heap, (-nxt.priority, (held[team] + nxt.gpu_weight) / self.weight(team, ctx), team, i + 1)
                )
        return out

    def can_preempt(
        self, job: JobRequest, job_key: Key, victim: RunningJob, victim_key: Key, ctx: Context
    ) -> bool:
        mine = ctx.quotas.get(job.team)
        theirs = ctx.quotas.get(victim.job.team)
        if mine is None or victim.job.team == job.team:
            return False
        nominal_theirs = theirs.gpus if theirs is not None else 0
        within = ctx.team_gpus.get(job.team, 0) + job.gpu_weight <= mine.gpus
        borrowing = ctx.team_gpus.get(victim.job.team, 0) > nominal_theirs
        return within and borrowing

    def victim_scope(self, job: JobRequest) -> object:
        return job.team
