"""A trace is a list of jobs as they were submitted. Every loader turns its format into
``TraceJob`` rows and reports the rows it could not use, by line number, instead of
failing: a site's own export is never perfectly clean.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceJob:
    """One job of a trace. ``submit_s`` is seconds from the trace's start (the first
    submit is not necessarily 0). ``gpus_per_node`` 0 = the scheduler decides;
    ``time_limit_s`` None = none requested; ``gpu_type`` None = any model."""

    job_id: str
    user: str
    team: str
    submit_s: float
    duration_s: float
    gpus: int
    gpus_per_node: int = 0
    time_limit_s: float | None = None
    priority: int = 0
    gpu_type: str | None = None
    dependency: str | None = None
    """Slurm's ``--dependency`` over this trace's (numeric) job ids: ``afterok:12``..."""


@dataclass(frozen=True, slots=True)
class TraceProblem:
    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass(slots=True)
class TraceLoad:
    """What a loader read: the jobs sorted by submit time, and the rows it skipped."""

    jobs: list[TraceJob] = field(default_factory=list)
    problems: list[TraceProblem] = field(default_factory=list)
    source: str = ""


class TraceError(Exception):
    """The file as a whole cannot be read (missing, wrong format, no header)."""


Loader = Callable[[Path], TraceLoad]


def offered_load(jobs: Sequence[TraceJob], fleet_gpus: int) -> float:
    """GPU-seconds asked for, over the GPU-seconds the fleet has between the first and the
    last submit. 0.0 for no jobs or no fleet; infinite when all jobs arrive at once."""
    if not jobs or fleet_gpus <= 0:
        return 0.0
    work = sum(job.gpus * job.duration_s for job in jobs)
    span = max(job.submit_s for job in jobs) - min(job.submit_s for job in jobs)
    return work / (fleet_gpus * span) if span > 0 else math.inf
