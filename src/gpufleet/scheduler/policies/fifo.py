"""``fifo``: strict order. Priority first, then submit time; nothing overtakes a job
that cannot start (head-of-line blocking is the point: it is the baseline)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gpufleet.scheduler.policies.base import BackfillMode, Policy


@dataclass(frozen=True, kw_only=True)
class FifoPolicy(Policy):
    name: ClassVar[str] = "fifo"
    backfill: ClassVar[BackfillMode] = "none"
