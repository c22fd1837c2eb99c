"""What an ended job left on its GPUs. On a real GPU a job's runner may say it is over
while NVML still lists processes of its account on its GPUs; its GPUs must not be
offered to the next job until they are clear. ``GpuSweeps`` kills those processes and
makes the agent report the job's end at a later tick, a bounded number of times."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterable

import psutil

from gpufleet import mig
from gpufleet.agent.jobs import LocalJob
from gpufleet.agent.probe import GpuProbe, ProcessProbe

log = logging.getLogger("gpufleet.agent")
Key = tuple[int, int]

GPU_SWEEPS = 3
"""How many ticks an ended job's leftovers on its GPUs are killed before it is reported
over regardless."""


class GpuSweeps:
    """How many times each attempt's leftovers were killed (the agent's lock guards it)."""

    def __init__(self) -> None:
        self._tries: dict[Key, int] = {}

    def sweep(self, job: LocalJob, *, held: Iterable[LocalJob], probe: GpuProbe) -> bool:
        """On a real GPU: the processes of the job's account NVML still lists on its GPUs
        once its runner says it is over (GPUs another running attempt of that account in
        ``held`` holds are left alone: whose is whose cannot be told). Killed, and True:
        its end is reported at a later tick, so its GPUs are offered only once they are
        clear; at most ``GPU_SWEEPS`` times (a process that does not die must not hold the
        job for ever: a warning says so)."""
        tries = self._tries.get(job.key, 0)
        if job.uid is None or not isinstance(probe, ProcessProbe) or tries >= GPU_SWEEPS:
            return False
        others = {
            mig.device_gpu(g)
            for j in held
            if j.key != job.key and j.exit_code is None and j.uid == job.uid
            for g in j.gpus
        }
        found: list[int] = []
        for gpu in sorted({mig.device_gpu(g) for g in job.gpus} - others):
            for pid in probe.gpu_pids(gpu):
                with contextlib.suppress(psutil.Error, OSError):
                    if psutil.Process(pid).uids().real == job.uid:
                        os.kill(pid, signal.SIGKILL)
                        found.append(pid)
        if found:
            self._tries[job.key] = tries + 1
            log.warning("job %s/%s: killed pids %s left on its GPUs", job.job_id, job.attempt, found)
        else:
            self._tries.pop(job.key, None)
        return bool(found)

    def forget(self, key: Key) -> None:
        """The attempt is gone from this node."""
        self._tries.pop(key, None)
