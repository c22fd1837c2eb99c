"""Slurm's licenses (``-L/--licenses NAME[:N],...``) against the counts an operator
declares (``gpufleet admin license set NAME COUNT``): a job starts only when every
license it names has that many free, counting running jobs and this pass's starts; else
it waits with Slurm's reason ``Licenses``. One explicit object per pass (held by ``cycle.CycleState``)."""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.scheduler.model import JobRequest, RunningJob


class LicenseUsage:
    __slots__ = ("_used", "total")

    def __init__(self, total: Iterable[tuple[str, int]], running: Iterable[RunningJob]) -> None:
        self.total = dict(total)
        self._used: dict[str, int] = {}
        if self.total:  # most fleets declare none: nothing to count
            for rj in running:
                self.take(rj.job)

    def take(self, job: JobRequest) -> None:
        for name, n in job.licenses:
            self._used[name] = self._used.get(name, 0) + n

    def blocked(self, job: JobRequest) -> str | None:
        """Why ``job``'s licenses are not free now (None: they are)."""
        for name, n in job.licenses:
            free = self.total.get(name, 0) - self._used.get(name, 0)
            if n > free:
                return f"needs {n} of license {name}, {max(free, 0)} of {self.total.get(name, 0)} free"
        return None
