"""CPUs and memory as resources next to GPUs (Slurm's ``--cpus-per-task``, ``--mem``):
what each node has free of them during one pass.

A node that reports no CPUs (``Node.cpus`` 0) or no memory is not limited in that
resource, and a job that asks for none is never held back by it, so a fleet or a
queue without these requests pays nothing: ``NodeResources.build`` returns None.

What a job asks is per node (``JobRequest.cpus``, ``mem_mb``), on each node of its
placement. The pass places GPU jobs on a view of the capacity without the nodes
where the job's CPUs or memory do not fit (``core._place_in``), and 0-GPU jobs on the
least-loaded node where they fit (``cpu.CpuPlacer``). Decisions where Slurm's
``select/cons_tres`` is richer: a job's request is the same on every node of it (a
per-GPU request of a job whose split the scheduler picks is counted for all its GPUs
on each node: never too little); preemption does not free CPUs or memory for a job
that asks for them (such a job waits instead of preempting); estimated starts count
GPUs only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpufleet.scheduler.model import Fleet, JobRequest, RunningJob


@dataclass(slots=True)
class _Free:
    cpus: int | None  # None: not tracked
    mem: int | None


class NodeResources:
    def __init__(self, free: dict[str, _Free]) -> None:
        self._free = free
        self.capacity = {name: (f.cpus, f.mem) for name, f in free.items()}
        """What each tracked node has in all (before any job)."""

    @classmethod
    def build(
        cls,
        fleet: Fleet,
        running: Sequence[RunningJob],
        pending: Iterable[JobRequest],
    ) -> NodeResources | None:
        """None when no node tracks CPUs or memory, or no waiting job asks for any."""
        if not any(n.cpus or n.mem_mb for n in fleet.nodes):
            return None
        if not any(j.cpus or j.mem_mb for j in pending):
            return None
        tracked = [n for n in fleet.nodes if n.cpus or n.mem_mb]
        self = cls({n.name: _Free(cpus=n.cpus or None, mem=n.mem_mb or None) for n in tracked})
        for rj in running:
            if rj.job.cpus or rj.job.mem_mb:
                self.take((p.node for p in rj.placement), rj.job)
        return self

    def fits(self, node: str, job: JobRequest) -> bool:
        f = self._free.get(node)
        if f is None:
            return True
        return (f.cpus is None or job.cpus <= f.cpus) and (f.mem is None or job.mem_mb <= f.mem)

    def take(self, nodes: Iterable[str], job: JobRequest) -> None:
        for node in set(nodes):
            f = self._free.get(node)
            if f is None:
                continue
            if f.cpus is not None:
                f.cpus -= job.cpus
            if f.mem is not None:
                f.mem -= job.mem_mb

    def never(self, job: JobRequest, nodes: Iterable[str]) -> str | None:
        """Why ``job`` can never run on any of ``nodes`` (its pool's), else None."""
        caps = [self.capacity.get(n, (None, None)) for n in nodes]
        if not caps:
            return None
        if all(c is not None and job.cpus > c for c, _ in caps):
            most = max(c or 0 for c, _ in caps)
            return f"needs {job.cpus} CPUs per node; the largest node of pool '{job.pool}' has {most}"
        if all(m is not None and job.mem_mb > m for _, m in caps):
            most = max(m or 0 for _, m in caps)
            return f"needs {job.mem_mb} MiB per node; the largest node of pool '{job.pool}' has {most} MiB"
        return None

    def describe(self, job: JobRequest) -> str:
        asked = []
        if job.cpus:
            asked.append(f"{job.cpus} CPUs")
        if job.mem_mb:
            asked.append(f"{job.mem_mb} MiB")
        return " and ".join(asked)
