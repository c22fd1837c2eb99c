"""A trace is a list of jobs as they were submitted. Every loader turns its format into
``TraceJob`` rows and reports the rows it could not use, by line number, instead of
failing: a site's own export is never perfectly clean.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.migindex import SHARE_UNITS

WHOLE_GPU = 1000
"""``TraceJob.gpu_milli`` of a job that asks for whole GPUs."""


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
    cuda: str | None = None
    """``--cuda``: the CUDA version it needs (``gpufleet.cudaver``; only nodes whose
    ``Node.cuda`` supports it)."""
    gpu_milli: int = WHOLE_GPU
    """The share of each of its GPUs the job asks for, in thousandths: 1000 = whole GPUs;
    1..999 = that fraction of ONE GPU (``gpus`` is then 1; see ``gpu_share_problem``).
    Traces of shared-GPU clusters (Alibaba's 2023 openb pods) are mostly such fractions.
    On a fleet with shared GPUs the simulator asks for a share of one
    (``ceil(gpu_milli / 10)`` of its 100 units, ``sim/shares.py``); without, a whole GPU."""
    checkpoint_s: float | None = None
    """How often the job saves its state, in seconds of work (``--checkpoint-every``); None:
    not declared (the simulator then assumes ``SimConfig.checkpoint_interval_s``)."""
    name: str = ""
    """The job's name (Slurm's JobName; "": unknown): with its user, what its run time is
    predicted from (``scheduler/predict.py``)."""


def gpu_share_problem(gpus: int, gpu_milli: int) -> str | None:
    """Why ``gpu_milli`` cannot go with ``gpus``, or None when it can: a share is 1..1000
    thousandths, and a fraction (< 1000) is of one GPU only, as a GPU-sharing scheduler
    places it (a 2-GPU job at 500 each would need two half-free GPUs: no trace asks that)."""
    if not 1 <= gpu_milli <= WHOLE_GPU:
        return f"gpu_milli {gpu_milli} is outside 1..{WHOLE_GPU}"
    if gpu_milli < WHOLE_GPU and gpus != 1:
        return f"gpu_milli {gpu_milli} (a fraction of one GPU) needs gpus 1, got {gpus}"
    return None


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


def share_units(gpu_milli: int) -> int:
    """The units (``migindex.SHARE_UNITS`` to a GPU) a ``gpu_milli`` share of one GPU asks
    for, rounded up: at least what it asked."""
    return math.ceil(gpu_milli * SHARE_UNITS / WHOLE_GPU)


def is_fractional(job: TraceJob) -> bool:
    """Whether ``job`` asks for part of one GPU."""
    return job.gpu_milli < WHOLE_GPU and job.gpus > 0


def gpu_weight(job: TraceJob, *, shares: bool = False) -> float:
    """GPUs ``job`` holds while it runs: its ``gpus``; with ``shares`` (a fleet with shared
    GPUs) a fractional job's units, in GPUs (``share_units`` / ``SHARE_UNITS``)."""
    if shares and is_fractional(job):
        return share_units(job.gpu_milli) / SHARE_UNITS
    return job.gpus


def offered_load(jobs: Sequence[TraceJob], fleet_gpus: int, *, shares: bool = False) -> float:
    """GPU-seconds asked for, over the GPU-seconds the fleet has between the first and the
    last submit. 0.0 for no jobs or no fleet; infinite when all jobs arrive at once.
    ``shares``: fractional jobs count as their share of a GPU (``gpu_weight``)."""
    if not jobs or fleet_gpus <= 0:
        return 0.0
    work = sum(gpu_weight(job, shares=shares) * job.duration_s for job in jobs)
    span = max(job.submit_s for job in jobs) - min(job.submit_s for job in jobs)
    return work / (fleet_gpus * span) if span > 0 else math.inf
