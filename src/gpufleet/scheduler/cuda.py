"""CUDA compatibility at placement: a job that declares the CUDA version it needs
(``submit --cuda 12.4``) goes only to nodes whose driver supports at least that version
(``Node.cuda``: what the node's agent reports, NVML's ``nvmlSystemGetCudaDriverVersion``),
as the field reports ask ("check that the node's driver matches the CUDA of the job's
image") and as NVIDIA's container toolkit refuses to start an image whose
``NVIDIA_REQUIRE_CUDA`` the driver does not meet, only here before placement rather than
at container start.

Two parts, like ``--constraint`` (``features.py``):

- the filter point (``cuda_wait``): when no node of the job's pool supports the version,
  the job waits with Slurm's ``BadConstraints`` and the reason in words ("needs CUDA
  12.4; the newest driver in pool p supports 12.2") until a driver upgrade changes that;
- the node filter (``supports``, applied by ``features.node_filters``): among the pool's
  nodes only those that support it are tried; those busy, the job waits for resources.

A node that reports no CUDA version supports none (nothing is assumed). The core does
not preempt for such a job (as for any filtered job: victims are chosen on any node).
"""

from __future__ import annotations

from gpufleet.cudaver import at_least, format_cuda
from gpufleet.scheduler.cycle import CycleState, Wait
from gpufleet.scheduler.model import JobRequest, Node, Status

__all__ = ["REASON", "cuda_wait", "newest_cuda", "supports"]

REASON = "BadConstraints"
"""Slurm's reason for constraints no node of the partition satisfies."""


def supports(node: Node, need: tuple[int, int] | None) -> bool:
    """``node``'s driver runs code built for CUDA ``need`` (None: anything runs)."""
    return need is None or at_least(node.cuda, need)


def newest_cuda(cs: CycleState, pool: str) -> tuple[int, int] | None:
    """The newest CUDA a driver in ``pool`` supports (None: no node reports one); once a pass."""
    if pool not in cs.newest_cuda:
        versions = [n.cuda for n in cs.snap.fleet.nodes if n.pool == pool and n.cuda is not None]
        cs.newest_cuda[pool] = max(versions) if versions else None
    return cs.newest_cuda[pool]


def cuda_wait(cs: CycleState, job: JobRequest) -> Wait | None:
    """Why no node of ``job``'s pool can ever run it as its drivers are (None: some can)."""
    need = job.cuda
    if need is None:
        return None
    newest = newest_cuda(cs, job.pool)
    if at_least(newest, need):
        return None
    have = (
        f"the newest driver in pool {job.pool} supports {format_cuda(newest)}"
        if newest is not None
        else f"no node in pool {job.pool} reports a CUDA version"
    )
    return Wait(Status.UNSCHEDULABLE, REASON, f"needs CUDA {format_cuda(need)}; {have}")
