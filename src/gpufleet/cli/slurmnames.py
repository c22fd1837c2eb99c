"""Slurm's names for gpufleet's things, as ``squeue``, ``scancel`` and ``sacct`` write
and read them: job ids of array tasks (``123_4``, ``123_[5-99]``) and job states.

gpufleet's states are finer than Slurm's in two places: HELD is Slurm's PENDING (with
reason ``JobHeldUser``) and SCHEDULED (placed, not yet started by its node) is Slurm's
RUNNING (allocated). PREEMPTED and REQUEUED are transit states a job never rests in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gpufleet.arrayspec import compact, parse_array

STATES = ("PENDING", "HELD", "SCHEDULED", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
"""gpufleet's job states (those a job rests in)."""
_SLURM = {
    "PENDING": ("PENDING", "HELD"),
    "PD": ("PENDING", "HELD"),
    "RUNNING": ("SCHEDULED", "RUNNING"),
    "R": ("SCHEDULED", "RUNNING"),
    "COMPLETED": ("COMPLETED",),
    "CD": ("COMPLETED",),
    "FAILED": ("FAILED",),
    "F": ("FAILED",),
    "CANCELLED": ("CANCELLED",),
    "CA": ("CANCELLED",),
    "TIMEOUT": ("TIMEOUT",),
    "TO": ("TIMEOUT",),
}


def states_of(names: Iterable[str]) -> list[str]:
    """gpufleet's states for state names as Slurm's commands take them (``PENDING``,
    ``PD``, ``RUNNING``, ``R``, ``CD``, ``CA``, ``F``, ``TO``; any case, comma lists),
    or gpufleet's own (``HELD``, ``SCHEDULED``). Raises ValueError naming a bad one."""
    out: list[str] = []
    for raw in names:
        for name in (n.strip().upper() for n in raw.split(",") if n.strip()):
            got = _SLURM.get(name) or ((name,) if name in STATES else None)
            if got is None:
                raise ValueError(f"--state={name}: one of {', '.join(STATES)} (or PD, R, CD, CA, F, TO)")
            out += [s for s in got if s not in out]
    return out


def slurm_state(state: str) -> str:
    """The state as ``sacct`` and ``squeue`` name it."""
    return {"HELD": "PENDING", "SCHEDULED": "RUNNING"}.get(state, state)


def job_id(job_id: int, array_job_id: int | None, array_task_id: int | None) -> str:
    """``123``, or ``123_4`` for task 4 of array 123."""
    if array_job_id is None or array_task_id is None:
        return str(job_id)
    return f"{array_job_id}_{array_task_id}"


def array_ids(array_job_id: int, tasks: Iterable[int]) -> str:
    """``123_[5-99]`` (``123_5`` for one task), as squeue shows pending tasks."""
    ids = sorted(set(tasks))
    return f"{array_job_id}_{ids[0]}" if len(ids) == 1 else f"{array_job_id}_[{compact(ids)}]"


def folded_ids(array_job_id: int, tasks: str, count: int | None) -> str:
    """``123_[5-99]`` of a folded listing item (``array_tasks``: ``5-99``, Slurm's index
    list, as the server wrote it; ``123_5`` for one task)."""
    return f"{array_job_id}_{tasks}" if count == 1 else f"{array_job_id}_[{tasks}]"


@dataclass(frozen=True, slots=True)
class JobRef:
    """A job as named on the command line: ``123`` (a job, or a whole array when 123 is
    an array's id), ``123_4`` or ``123_[1-3,7]`` (tasks of array 123)."""

    job: int
    tasks: tuple[int, ...] | None = None

    def __str__(self) -> str:
        return str(self.job) if self.tasks is None else array_ids(self.job, self.tasks)


_REF = re.compile(r"^(\d+)(?:_(\d+|\[[^\]]+\]))?$")


def parse_ref(text: str) -> JobRef:
    """Raises ValueError with the words to show."""
    m = _REF.match(text.strip())
    if m is None:
        raise ValueError(f"{text!r} is not a job id (123, 123_4 or 123_[1-3])")
    job, tasks = int(m.group(1)), m.group(2)
    if tasks is None:
        return JobRef(job)
    if tasks.isdigit():
        return JobRef(job, (int(tasks),))
    try:
        spec = parse_array(tasks[1:-1])
    except ValueError as exc:
        raise ValueError(f"{text}: {str(exc).partition(': ')[2]}") from None
    if spec.limit:
        raise ValueError(f"{text}: no %limit in a job id")
    return JobRef(job, spec.indices)


__all__ = ["STATES", "JobRef", "array_ids", "job_id", "parse_ref", "slurm_state", "states_of"]
