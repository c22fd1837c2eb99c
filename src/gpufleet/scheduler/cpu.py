"""Placement of 0-GPU (CPU-only) jobs: on the schedulable node of the job's pool that
runs the fewest jobs, ties by node name.

Why this shape:

* A node's count of jobs is the load measure until CPU and memory become resources (a
  later issue): every job that runs on a node counts once (GPU jobs included, whatever
  their width), plus the starts this pass decided, less the jobs it preempts.
* The pool, ``--constraint`` and ``--exclude`` filter (a 0-GPU job's ``gpus_per_node``,
  ``nodes``, ``gpu_type`` and ``reservation`` do not apply). A 0-GPU job may land on any
  schedulable node of its pool, with or without GPUs, as in Slurm, where a job gets no
  GPU unless it asks (a CPU-only pool refuses GPU jobs; a GPU pool takes both). Their
  CPUs and memory are what keeps them from crowding a GPU server (``resources.py``).
* They never compete with GPU jobs: they take no queue position, no GPU, no shadow
  reservation, and GPU quotas do not apply to them; they are never preempted, never
  victims, never wait behind a GPU job, and a GPU job never waits behind them. A job
  that cannot be placed (its pool has no schedulable node) waits with an Unschedulable
  reason, no queue position and no estimated start.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Sequence

from gpufleet.scheduler.features import NodeFilter, node_filters
from gpufleet.scheduler.model import Fleet, JobRequest, NodeGpus, RunningJob, Start
from gpufleet.scheduler.resources import NodeResources


class CpuPlacer:
    """The node loads of one pass, built on first use (most passes have no 0-GPU job)."""

    __slots__ = ("_heaps", "_known", "fleet", "resources")

    def __init__(
        self,
        fleet: Fleet,
        running: Sequence[RunningJob],
        *,
        preempted: Collection[str] = (),
        starts: Iterable[Start] = (),
        resources: NodeResources | None = None,
    ) -> None:
        self.fleet = fleet
        self.resources = resources
        jobs: dict[str, int] = {}
        for rj in running:
            if rj.job.id in preempted:
                continue
            for node in {p.node for p in rj.placement}:
                jobs[node] = jobs.get(node, 0) + 1
        for st in starts:
            for node in {p.node for p in st.placement}:
                jobs[node] = jobs.get(node, 0) + 1
        heaps: dict[str, list[tuple[int, str]]] = {}
        known: set[str] = set()
        for n in fleet.nodes:
            known.add(n.pool)
            if n.schedulable:
                heaps.setdefault(n.pool, []).append((jobs.get(n.name, 0), n.name))
        for h in heaps.values():
            heapq.heapify(h)
        self._heaps = heaps
        self._known = known

    def place(self, job: JobRequest) -> Start | str:
        """Start ``job`` on its pool's least-loaded node (and count it there), or say
        why it cannot start."""
        heap = self._heaps.get(job.pool)
        if not heap:
            if job.pool in self._known:
                return f"Unschedulable: no schedulable node in pool '{job.pool}' (all cordoned or not ready)"
            return f"Unschedulable: no node in pool '{job.pool}'"
        res = self.resources
        filters = node_filters(job)
        if (res is None or not (job.cpus or job.mem_mb)) and not filters:
            jobs, name = heap[0]
            heapq.heapreplace(heap, (jobs + 1, name))
            return Start(job_id=job.id, placement=(NodeGpus(node=name, gpus=()),))
        allowed = self._allowed(filters)
        for jobs, name in sorted(heap):  # the least-loaded node where it fits
            if name not in allowed:
                continue
            if res is None or not (job.cpus or job.mem_mb) or res.fits(name, job):
                heap.remove((jobs, name))
                heapq.heapify(heap)
                heapq.heappush(heap, (jobs + 1, name))
                if res is not None:
                    res.take([name], job)
                return Start(job_id=job.id, placement=(NodeGpus(node=name, gpus=()),))
        if res is None or not (job.cpus or job.mem_mb):
            return f"Unschedulable: no node of pool '{job.pool}' has its features or is not excluded"
        return f"Resources: needs {res.describe(job)} per node, free on no node of pool '{job.pool}'"

    def _allowed(self, filters: list[NodeFilter]) -> set[str]:
        """The node names any of ``filters`` lets the job use (no filters: all)."""
        return {n.name for n in self.fleet.nodes if not filters or any(f(n) for f in filters)}
