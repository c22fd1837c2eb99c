"""``backfill``: FIFO order with EASY backfill on requested time limits (Slurm's
``sched/backfill`` without its depth limits).

The first job that cannot start gets a reservation at its earliest start time (the
*shadow time*) on the nodes it would get then. A later job may start now if it ends
(by its time limit) before the shadow time, or if it only uses GPUs the reserved job
leaves spare. A job without a time limit counts as ``default_time_limit_s`` long.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gpufleet.scheduler.policies.base import BackfillMode, Policy


@dataclass(frozen=True, kw_only=True)
class BackfillPolicy(Policy):
    name: ClassVar[str] = "backfill"
    backfill: ClassVar[BackfillMode] = "easy"
