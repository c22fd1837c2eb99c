"""Slurm's QOS per-user limits, as the core enforces them: a job of a QOS with
``max_gpus_per_user`` (Slurm's ``MaxTRESPerUser=gres/gpu=N``) or ``max_jobs_per_user``
(``MaxJobsPerUser``) waits while its user's running jobs of that QOS are at the limit,
with Slurm's pending reasons ``QOSMaxGRESPerUser`` and ``QOSMaxJobsPerUserLimit``.

A QOS's priority and preemptability are not here: the server adds the priority to the
job's and clears ``preemptible`` when it builds the job's request, so every policy sees
them as it sees any job's. Usage counts the snapshot's running jobs plus this pass's
starts (one explicit object per pass, held by ``cycle.CycleState``).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.scheduler.model import JobRequest, QosLimit, RunningJob


class QosUsage:
    """GPUs and jobs per (QOS, user), running or started this pass."""

    __slots__ = ("_gpus", "_jobs", "limits")

    def __init__(self, limits: Iterable[QosLimit], running: Iterable[RunningJob]) -> None:
        self.limits = {
            q.name: q for q in limits if q.max_gpus_per_user is not None or q.max_jobs_per_user is not None
        }
        self._gpus: dict[tuple[str, str], float] = {}
        self._jobs: dict[tuple[str, str], int] = {}
        if self.limits:
            for rj in running:
                self.take(rj.job)

    def take(self, job: JobRequest) -> None:
        """Count ``job`` as running (a start of this pass)."""
        if job.qos is None or job.qos not in self.limits:
            return
        key = (job.qos, job.user)
        self._gpus[key] = self._gpus.get(key, 0.0) + job.gpu_weight
        self._jobs[key] = self._jobs.get(key, 0) + 1

    def blocked(self, job: JobRequest) -> tuple[str, str] | None:
        """(Slurm's reason code, the detail) while ``job`` would pass its QOS's per-user
        limits; None: it may start."""
        limit = self.limits.get(job.qos) if job.qos is not None else None
        if limit is None:
            return None
        key = (limit.name, job.user)
        jobs = self._jobs.get(key, 0)
        if limit.max_jobs_per_user is not None and jobs + 1 > limit.max_jobs_per_user:
            return (
                "QOSMaxJobsPerUserLimit",
                f"{job.user} runs {jobs} jobs of QOS {limit.name}, "
                f"its limit per user is {limit.max_jobs_per_user}",
            )
        gpus = self._gpus.get(key, 0.0)
        if limit.max_gpus_per_user is not None and gpus + job.gpu_weight > limit.max_gpus_per_user:
            return (
                "QOSMaxGRESPerUser",
                f"{job.user} holds {gpus:g} GPUs in QOS {limit.name} of its "
                f"{limit.max_gpus_per_user} per user, job needs {job.gpu_weight:g}",
            )
        return None
